"""Manifests: a JSON file beside each artifact describing exactly what was written.

A manifest lists sha256 and size of every file of the artifact, record and token
counts, the stage parameters, upstream keys, library versions and times. `verify`
re-hashes artifacts against their manifests.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

from draftsmith.fsutil import atomic
from draftsmith.fsutil.digests import sha256_file
from draftsmith.store.plan import Artifact

_LIBRARIES = (
    "draftsmith",
    "snakemake",
    "torch",
    "transformers",
    "tokenizers",
    "safetensors",
    "httpx",
)


def library_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for name in _LIBRARIES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def describe_files(root: Path, files: list[Path]) -> dict[str, dict]:
    """sha256 and size of each file (directories expand to their files)."""
    described: dict[str, dict] = {}
    for path in files:
        members = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for member in members:
            described[os.path.relpath(member, root)] = {
                "sha256": sha256_file(member),
                "size": member.stat().st_size,
            }
    return described


def write(
    artifact: Artifact,
    path: str | os.PathLike,
    files: list[str | os.PathLike],
    stats: dict[str, Any],
    started: float,
) -> dict:
    """Write the artifact's manifest last, after every file it describes is in place.

    Its params and upstream keys are exactly what the artifact's key hashed; `path` is
    the rule's declared manifest (the artifact's own in a workflow run)."""
    path = Path(path)
    manifest = {
        "stage": artifact.stage,
        "key": artifact.key,
        "files": describe_files(path.parent, [Path(f) for f in files]),
        "params": artifact.params,
        "upstream": artifact.upstream,
        "stats": stats,
        "versions": library_versions(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "wall_s": round(time.time() - started, 3),
    }
    atomic.write_json(path, manifest)
    return manifest


def read(path: str | os.PathLike) -> dict:
    return json.loads(Path(path).read_text())


def check(manifest_path: Path, rehash: bool = True) -> list[str]:
    """Problems with one artifact: missing or corrupt files named relative to the root
    (sizes only unless `rehash`)."""
    try:
        manifest = read(manifest_path)
    except (OSError, ValueError) as exc:
        return [f"{manifest_path}: unreadable manifest ({exc})"]
    problems = []
    for name, expected in manifest["files"].items():
        member = manifest_path.parent / name
        if not member.exists():
            problems.append(f"{member}: missing")
        elif member.stat().st_size != expected["size"]:
            problems.append(f"{member}: size {member.stat().st_size} != {expected['size']}")
        elif rehash and sha256_file(member) != expected["sha256"]:
            problems.append(f"{member}: sha256 mismatch")
    return problems
