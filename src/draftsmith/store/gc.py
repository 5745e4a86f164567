"""Garbage collection: artifact directories of the store that no given config plans.

A key directory is worth keeping while some config plans that key; which configs matter
is the caller's say (every config given is planned, nothing else). Only directories named
by a key under a stage word are considered, so temp directories, the hash cache and
anything else in the store are never touched. Deleting renames the directory to a temp
name first: a crash mid-delete leaves a `.tmp-` directory (which nothing takes for an
artifact), never a half-emptied one under its key.
"""

from __future__ import annotations

import os
import shutil
import string
from collections.abc import Iterable
from pathlib import Path

from draftsmith.store import atomic
from draftsmith.store.atomic import TMP_PREFIX, fsync_dir, temp_name
from draftsmith.store.hashing import KEY_LENGTH
from draftsmith.store.keys import STAGES
from draftsmith.store.plan import Plan


def is_key(name: str) -> bool:
    return len(name) == KEY_LENGTH and all(c in string.hexdigits.lower() for c in name)


def key_dirs(parent: Path) -> list[Path]:
    """The directories directly under `parent` that are named by a key."""
    if not parent.is_dir():
        return []
    return sorted(p for p in parent.iterdir() if p.is_dir() and is_key(p.name))


def artifact_dirs(root: Path) -> list[Path]:
    """Every `<stage>/<key>` and `<stage>/<dataset>/<key>` directory under the store root."""
    found = []
    for stage in STAGES:
        found += key_dirs(root / stage)
        for dataset in dataset_dirs(root / stage):
            found += key_dirs(dataset)
    return found


def dataset_dirs(stage_dir: Path) -> list[Path]:
    """A stage's per-dataset directories (neither keys nor temp directories)."""
    if not stage_dir.is_dir():
        return []
    return sorted(
        p
        for p in stage_dir.iterdir()
        if p.is_dir() and not is_key(p.name) and not p.name.startswith(TMP_PREFIX)
    )


def unreferenced(plans: Iterable[Plan]) -> list[Path]:
    """Artifact directories under the plans' roots that none of the plans names."""
    plans = list(plans)
    referenced = {a.directory.resolve() for plan in plans for a in plan.artifacts}
    roots = sorted({plan.root.resolve() for plan in plans})
    return [d for root in roots for d in artifact_dirs(root) if d.resolve() not in referenced]


def size(directory: Path) -> int:
    """Bytes under `directory`, a hard-linked file counted once, symlinks not followed."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for parent, _, names in os.walk(directory):
        for name in names:
            stat = os.lstat(os.path.join(parent, name))
            if (stat.st_dev, stat.st_ino) not in seen:
                seen.add((stat.st_dev, stat.st_ino))
                total += stat.st_size
    return total


def stale_temps(root: Path) -> list[Path]:
    """Temporaries anywhere in the store whose process is gone (see `atomic.is_stale_temp`);
    what lies inside a stale temp directory is not listed again."""
    found = sorted(p for p in root.rglob(f"{TMP_PREFIX}*") if atomic.is_stale_temp(p))
    return [p for p in found if not any(parent in found for parent in p.parents)]


def remove(directory: Path) -> None:
    """Delete an artifact directory: out of its key's name first, then its files."""
    doomed = directory.with_name(temp_name(f"{directory.name}.gc"))
    os.rename(directory, doomed)
    fsync_dir(directory.parent)
    shutil.rmtree(doomed)
