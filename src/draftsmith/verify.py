"""Re-hash artifacts against their manifests; optionally quarantine the corrupt ones.

Quarantining renames every file of a corrupt artifact (and its manifest) to
`<name>.corrupt`, so Snakemake sees the outputs missing and a rerun rebuilds
exactly that artifact.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from draftsmith import manifest


def find_manifests(root: Path) -> list[Path]:
    return sorted(root.rglob(manifest.MANIFEST_NAME))


def verify(root: Path) -> dict[Path, list[str]]:
    """Problems per manifest (empty list: intact)."""
    return {path: manifest.check(path) for path in find_manifests(root)}


def quarantine(manifest_path: Path) -> list[Path]:
    moved = []
    try:
        names = list(manifest.read(manifest_path)["files"])
    except (OSError, ValueError):
        names = []
    for name in [*names, manifest.MANIFEST_NAME]:
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
