"""Re-hash artifacts against their manifests; optionally quarantine the corrupt ones.

Quarantining renames every file of a corrupt artifact (and its manifest) to
`<name>.corrupt`, so Snakemake sees the outputs missing and a rerun rebuilds
exactly that artifact.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from draftsmith.formats import shards
from draftsmith.store import manifest
from draftsmith.store.plan import MANIFEST, STAGED

SHARD_INDEX_GLOB = "shard-*.json"


def find_manifests(root: Path) -> list[Path]:
    """Stage manifests and hidden-state shard indexes (each shard is its own artifact)."""
    found = [*root.rglob(MANIFEST), *root.rglob(SHARD_INDEX_GLOB)]
    # Staged files are hard links of the declared ones (store.staging).
    return sorted(p for p in found if STAGED not in p.parts)


def _is_shard(path: Path) -> bool:
    return path.match(SHARD_INDEX_GLOB)


def check(path: Path) -> list[str]:
    if not _is_shard(path):
        return manifest.check(path)
    try:
        return shards.ShardReader(path.parent, path.stem).verify()
    except shards.ShardError as exc:
        return [f"{path}: {exc}"]


def verify(root: Path) -> dict[Path, list[str]]:
    """Problems per manifest (empty list: intact)."""
    return {path: check(path) for path in find_manifests(root)}


def _members(manifest_path: Path) -> list[str]:
    if _is_shard(manifest_path):
        return [manifest_path.stem + ".bin", manifest_path.name]
    try:
        names = list(manifest.read(manifest_path)["files"])
    except (OSError, ValueError):
        names = []
    return [*names, MANIFEST]


def quarantine(manifest_path: Path) -> list[Path]:
    moved = []
    for name in _members(manifest_path):
        member = manifest_path.parent / name
        if member.exists():
            os.replace(member, member.with_name(member.name + ".corrupt"))
            moved.append(member)
    return moved


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path, help="artifact root (config artifacts_dir)")
    parser.add_argument("--fix", action="store_true", help="quarantine corrupt artifacts")
    args = parser.parse_args(argv)
    results = verify(args.root)
    bad = {p: problems for p, problems in results.items() if problems}
    rebuild = []
    for path, problems in bad.items():
        print(f"CORRUPT {path.parent}")
        for problem in problems:
            print(f"  {problem}")
        if args.fix:
            quarantine(path)
            rebuild.append(str(path))
            print("  quarantined")
    print(f"verify: {len(results)} artifacts checked, {len(bad)} corrupt")
    if rebuild:
        # Naming the outputs rebuilds exactly these artifacts; a plain `snakemake`
        # would not, since downstream results that already exist need nothing.
        print("rebuild exactly these with:\n  snakemake " + " ".join(rebuild))
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
