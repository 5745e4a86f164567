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

Stored states (`hidden/<states key>/`) are collected per shard: a states store no config
plans goes whole; in one that is planned, a finished shard none of whose samples a planned
mix's view lists is deleted (its index first, so a crash leaves at most a shard that is
assigned but not extracted, which the next run that needs it extracts again, then its
samples file and data). Unused samples in a shard that also holds used ones are only
counted: shards are written whole. Until every planned view of a store is written, the
samples it needs are unknown and every shard there stays.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from draftsmith.fsutil import atomic
from draftsmith.fsutil.atomic import TMP_PREFIX, fsync_dir, temp_name
from draftsmith.store import answers, lock
from draftsmith.store.keys import STAGES, is_key
from draftsmith.store.layout import LOCKS, SHARD_SAMPLES, shard_path, shard_samples_path, stored_samples
from draftsmith.store.plan import Plan

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


@dataclass
class UnusedStates:
    """The stored samples of one planned states store that no given config's mix uses."""

    root: Path
    store: Path
    shards: list[str]  # finished shards holding only unused samples: they go
    samples: int  # unused samples in those shards
    size: int  # bytes of those shards' files
    kept_samples: int  # unused samples in shards that also hold used ones (they stay)
    kept: str | None = None  # why every shard there stays, whatever the configs say


def unused_states(plans: Iterable[Plan]) -> list[UnusedStates]:
    """Per states store the plans extract into, the shards and samples no planned mix uses."""
    plans = list(plans)
    found = []
    for store in sorted({plan.states.directory.resolve() for plan in plans}):
        shard_of = stored_samples(store) if store.is_dir() else {}
        if not shard_of:
            continue
        root = next(p.root.resolve() for p in plans if p.states.directory.resolve() == store)
        views = [p.hidden.path("assignment") for p in plans if p.states.directory.resolve() == store]
        unbuilt = [view for view in views if not view.exists()]
        if unbuilt:
            reason = (
                f"{unbuilt[0].parent} is planned but not assigned yet, so the samples it needs are unknown"
            )
            found.append(UnusedStates(root, store, [], 0, 0, 0, reason))
            continue
        used = {row[1] for view in views for row in json.loads(view.read_text(encoding="utf-8"))["samples"]}
        unused = {address for address in shard_of if address not in used}
        kept_shards = {shard_of[address] for address in shard_of if address in used}
        doomed = sorted({shard_of[address] for address in unused} - kept_shards)
        size = sum(_shard_bytes(store, name) for name in doomed)
        gone = sum(1 for address in unused if shard_of[address] in doomed)
        found.append(UnusedStates(root, store, doomed, gone, size, len(unused) - gone))
    return found


def _shard_files(store: Path, name: str) -> list[Path]:
    """A shard's files in the order gc deletes them: index (unfinished from then on),
    samples (no longer assigned), data."""
    return [shard_path(store, name, "index"), shard_samples_path(store, name), shard_path(store, name, "bin")]


def _shard_bytes(store: Path, name: str) -> int:
    return sum(path.stat().st_size for path in _shard_files(store, name) if path.exists())


def states_kept(item: UnusedStates, grace_s: float) -> str | None:
    """Why gc would leave these shards now, or None."""
    return item.kept or kept(item.root, item.store, grace_s)


def remove_states(item: UnusedStates, grace_s: float) -> str | None:
    """Delete the unused shards unless their store is in use (a job holds its directory
    lock, or it was written within `grace_s` seconds): then return why they stay. Under
    the store's assign lock too, so no mix is assigned to a shard being deleted."""
    if item.kept is not None:
        return item.kept
    doomed = []
    with claim(item.root, item.store, grace_s) as reason:
        if reason is not None:
            return reason
        with lock.held(lock.lock_path(item.root, item.store / SHARD_SAMPLES)):
            for name in item.shards:
                for path in _shard_files(item.store, name):
                    if path.exists():
                        doomed.append(path.with_name(temp_name(f"{path.name}.gc")))
                        os.rename(path, doomed[-1])
                        fsync_dir(path.parent)
    for path in doomed:  # under temp names now: no lock needed
        path.unlink()
    return None
