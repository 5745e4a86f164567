"""Garbage collection: artifact directories of the store that no given config plans.

A key directory is worth keeping while some config plans that key; which configs matter
is the caller's say (every config given is planned, nothing else). Only directories named
by a key under a stage word are considered, so temp directories, the hash cache and
anything else in the store are never touched.

Another run on the same store may be building a directory that the configs given here do
not plan. gc leaves a directory alone while a job holds its directory lock
(`lock.directory_lock`, held shared by every job writing there) and while anything in it
was written within a grace period (a job that just finished, whose run has yet to see
its outputs). It deletes holding that lock exclusively, so a job starting meanwhile
waits. Deleting renames the directory to a temp name first: a crash mid-delete leaves a
`.tmp-` directory (which nothing takes for an artifact, and the next gc removes), never
a half-emptied one under its key.

Stored answers (`store.answers`) are collected per generation key: an answer is in use
when a responses artifact some config plans holds its prompt. A generation key no config
plans goes whole; in one that is planned, the answers no planned dataset asks for are
dropped (an atomic rewrite of its file under its lock). While a planned responses artifact
of a generation key is not built yet, its prompts are unknown and every answer there stays.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from draftsmith.store import answers, atomic, lock
from draftsmith.store.atomic import TMP_PREFIX, fsync_dir, temp_name
from draftsmith.store.keys import STAGES, is_key
from draftsmith.store.plan import LOCKS, Plan

# Directories written less than this long ago are left alone (`draftsmith gc --grace`).
DEFAULT_GRACE_S = 15 * 60


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


def unreferenced(plans: Iterable[Plan]) -> list[tuple[Path, Path]]:
    """(store root, directory) of each artifact directory under the plans' roots that none
    of the plans names."""
    plans = list(plans)
    referenced = {a.directory.resolve() for plan in plans for a in plan.artifacts}
    roots = sorted({plan.root.resolve() for plan in plans})
    return [(root, d) for root in roots for d in artifact_dirs(root) if d.resolve() not in referenced]


def size(directory: Path) -> int:
    """Bytes under `directory`, a hard-linked file counted once, symlinks not followed."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for parent, _, names in os.walk(directory):
        for name in names:
            try:
                stat = os.lstat(os.path.join(parent, name))
            except FileNotFoundError:  # a job's temp renamed meanwhile
                continue
            if (stat.st_dev, stat.st_ino) not in seen:
                seen.add((stat.st_dev, stat.st_ino))
                total += stat.st_size
    return total


def stale_temps(root: Path) -> list[Path]:
    """Temporaries anywhere in the store whose process is gone (see `atomic.is_stale_temp`);
    what lies inside a stale temp directory is not listed again."""
    found = sorted(p for p in root.rglob(f"{TMP_PREFIX}*") if atomic.is_stale_temp(p))
    return [p for p in found if not any(parent in found for parent in p.parents)]


def last_written(directory: Path) -> float:
    """The newest modification time of `directory` and of anything under it."""
    newest = directory.lstat().st_mtime
    for parent, names, files in os.walk(directory):
        for name in [*names, *files]:
            with contextlib.suppress(FileNotFoundError):  # a temp renamed meanwhile
                newest = max(newest, os.lstat(os.path.join(parent, name)).st_mtime)
    return newest


@contextlib.contextmanager
def claim(root: Path, directory: Path, grace_s: float, hold: bool = True) -> Iterator[str | None]:
    """Hold `directory`'s lock exclusively if no job holds it; yield None when the directory
    may go (while it is held, no job starts writing there), else why it stays. Without
    `hold` a lock file that does not exist yet is not created (listing writes nothing)."""
    with lock.taken_at_once(lock.directory_lock(root, directory), create=hold) as taken:
        # A job's own lock counts too: a checkout from before directory locks takes only that.
        users = lock.holders(Path(root) / LOCKS / lock.in_store(root, directory))
        if not taken or users:
            yield f"in use: its lock is held by {', '.join(users) or 'a job'}"
            return
        if not directory.is_dir():
            yield "already gone"
            return
        ago = time.time() - last_written(directory)
        if ago < grace_s:
            yield f"written {ago:.0f} s ago, within the grace period of {grace_s / 60:g} min (--grace)"
            return
        yield None


def kept(root: Path, directory: Path, grace_s: float) -> str | None:
    """Why gc would leave `directory` now, or None."""
    with claim(root, directory, grace_s, hold=False) as reason:
        return reason


def remove(root: Path, directory: Path, grace_s: float) -> str | None:
    """Delete an artifact directory unless it is in use or was written within `grace_s`
    seconds (then return why it stays): out of its key's name under its lock, then its files."""
    with claim(root, directory, grace_s) as reason:
        if reason is not None:
            return reason
        doomed = directory.with_name(temp_name(f"{directory.name}.gc"))
        os.rename(directory, doomed)
        fsync_dir(directory.parent)
    shutil.rmtree(doomed)  # under no key's name now: no lock needed
    return None


@dataclass
class UnusedAnswers:
    """The stored answers of one generation key that no given config uses."""

    root: Path
    directory: Path
    unused: set[str]  # their addresses
    size: int  # bytes of their lines
    whole: bool  # no config plans this generation key: its directory goes
    kept: str | None = None  # why every answer there stays, whatever the configs say


def unused_answers(plans: Iterable[Plan]) -> list[UnusedAnswers]:
    """Per answer store under the plans' roots, the answers none of the plans asks for."""
    plans = list(plans)
    found = []
    for root in sorted({plan.root.resolve() for plan in plans}):
        for directory in answers.stores(root):
            users = [
                plan.responses[name]
                for plan in plans
                for name, store in plan.answers.items()
                if store.resolve() == directory.resolve()
            ]
            contents = answers.read(answers.file_of(directory))
            stored = {a[answers.ADDRESS] for a in contents.answers}
            unbuilt = [a for a in users if not a.manifest.exists()]
            if unbuilt:
                reason = (
                    f"{unbuilt[0].directory} is planned but not built, so the prompts it needs are unknown"
                )
                found.append(UnusedAnswers(root, directory, set(), 0, False, reason))
                continue
            used = {
                answers.address(record["messages"])
                for artifact in users
                for record in atomic.read_jsonl(artifact.path("responses"))
            }
            unused = stored - used
            size = sum(contents.sizes[at] for at in unused)
            found.append(UnusedAnswers(root, directory, unused, size, whole=not users))
    return found


def answers_kept(item: UnusedAnswers, grace_s: float) -> str | None:
    """Why gc would leave these answers now, or None."""
    return item.kept or kept(item.root, item.directory, grace_s)


def remove_answers(item: UnusedAnswers, grace_s: float) -> str | None:
    """Delete unused answers unless their store is in use or was written within `grace_s`
    seconds (then return why they stay): the whole directory when no config plans its key."""
    if item.kept is not None:
        return item.kept
    if item.whole:
        return remove(item.root, item.directory, grace_s)
    with claim(item.root, item.directory, grace_s) as reason:
        if reason is None:
            answers.rewrite(item.directory, lambda answer: answer[answers.ADDRESS] not in item.unused)
        return reason
