"""Store locks: one process at a time builds a given artifact, whoever started it.

Every keyed job holds an exclusive `flock` on `<store>/.locks/<its first output>.lock`
while it runs (`runtime.jobs.from_snakemake`). A second process about to build the same
files (another checkout, another user, another cluster job on the same store) waits
for the lock, then finds the files finished and skips the work (`complete`), so no
artifact is built twice and no journal gets a record twice.

Guarantee and limits:
- `flock` is released by the kernel when its holder dies, kill -9 included: a dead
  process never leaves a stale lock behind.
- Local file systems honour it across processes and users. On NFS, Linux emulates
  `flock` with byte-range locks served by lockd (NFSv3) or the server (NFSv4), so it
  holds across hosts there too; a file system mounted with `nolock`, or one without
  lock support, gives each host only its own locks.
- It orders jobs, not workflows: two runs may each decide a job is needed; the later
  one waits and then finds the work done.

Each job also holds a shared lock on its artifact directory,
`<store>/.locks/<stage>/[<dataset>/]<key>.lock`, which `draftsmith gc` takes
exclusively (without waiting) before it removes that directory: gc never removes a
directory a job is writing, and a job that starts meanwhile waits until gc is done.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import socket
from collections.abc import Iterator
from pathlib import Path

from draftsmith.fsutil import atomic
from draftsmith.store import manifest
from draftsmith.store.layout import LOCKS, MANIFEST, STAGED, key_directory

log = logging.getLogger(__name__)


def in_store(root: Path, path: Path) -> Path | None:
    """`path` relative to the store `root`, or None when it lies outside the store."""
    relative = Path(os.path.relpath(Path(path).absolute(), Path(root).absolute()))
    return None if relative.parts[0] == os.pardir else relative


def lock_path(root: Path, built: Path) -> Path:
    """The lock of the job whose first output is `built` (a path under the store `root`)."""
    relative = in_store(root, built)
    if relative is None:
        raise ValueError(f"{built} is not under the store {root}")
    return Path(root) / LOCKS / f"{relative}.lock"


def directory_lock(root: Path, directory: Path) -> Path:
    """The lock of an artifact directory (`<stage>/[<dataset>/]<key>` under the store `root`)."""
    relative = in_store(root, directory)
    if relative is None:
        raise ValueError(f"{directory} is not under the store {root}")
    return Path(root) / LOCKS / f"{relative}.lock"


def complete(outputs: list[Path]) -> bool:
    """Every declared output is in place, and each manifest among them finds its files
    whole (by size; `verify` re-hashes)."""
    for path in outputs:
        if not path.exists():
            return False
        if path.name == MANIFEST and manifest.check(path, rehash=False):
            return False
    return True


@contextlib.contextmanager
def building(root: Path, outputs: list[str | os.PathLike]) -> Iterator[bool]:
    """Hold the lock of the job that writes `outputs`; yield whether the work is still to
    do. Jobs writing outside the store (reports of a run) take no lock."""
    declared = [Path(p) for p in outputs]
    if not declared or in_store(root, declared[0]) is None:
        yield True
        return
    with contextlib.ExitStack() as locks:
        directory = key_directory(in_store(root, declared[0]))
        if directory is not None:
            locks.enter_context(shared(directory_lock(root, Path(root) / directory)))
        locks.enter_context(held(lock_path(root, declared[0])))
        yield _still_to_do(declared)


def _still_to_do(declared: list[Path]) -> bool:
    """Under the job's locks: clear dead processes' temporaries, and say whether the work is
    still to do."""
    for parent in {p.parent for p in declared}:
        parent.mkdir(parents=True, exist_ok=True)  # gc may have removed it while the job waited
    directories = {p.parent for p in declared} | {p.parent / STAGED for p in declared}
    for directory in sorted(directories):
        for leftover in atomic.remove_stale_temps(directory):
            log.info("removed %s, left by a process that died", leftover)
    if complete(declared):
        log.info("%s: already built (by another process); nothing to do", declared[0].parent)
        return False
    return True


@contextlib.contextmanager
def held(path: Path) -> Iterator[None]:
    """Hold the exclusive lock at `path`, waiting (and saying so) while another holds it."""
    with _flock(path, fcntl.LOCK_EX) as fd:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{socket.gethostname()} pid {os.getpid()}\n".encode(), 0)
        yield


@contextlib.contextmanager
def shared(path: Path) -> Iterator[None]:
    """Hold the lock at `path` shared with other holders, waiting while one holds it exclusively."""
    with _flock(path, fcntl.LOCK_SH):
        yield


@contextlib.contextmanager
def taken_at_once(path: Path, create: bool = True) -> Iterator[bool]:
    """Hold the exclusive lock at `path` if nobody holds it now; yield whether it was taken.
    Without `create` nothing is written: a lock file that does not exist is held by nobody."""
    if not create and not path.exists():
        yield True
        return
    with _flock(path, fcntl.LOCK_EX, wait=False, create=create) as fd:
        yield fd is not None


def holders(directory_locks: Path) -> list[str]:
    """Who holds the job locks under `directory_locks` now (host and pid each), for messages."""
    found = []
    for path in sorted(directory_locks.rglob("*.lock")) if directory_locks.is_dir() else []:
        with _flock(path, fcntl.LOCK_SH, wait=False, create=False) as fd:
            if fd is None:
                found.append(holder(path) or str(path))
    return found


@contextlib.contextmanager
def _flock(path: Path, operation: int, wait: bool = True, create: bool = True) -> Iterator[int | None]:
    """`flock(operation)` on `path`; yields the descriptor, or None when `wait` is off and
    another process holds a conflicting lock."""
    if create:
        path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT if create else os.O_RDONLY, 0o666)
    try:
        try:
            fcntl.flock(fd, operation | fcntl.LOCK_NB)
        except BlockingIOError:
            if not wait:
                yield None
                return
            log.info("waiting for %s, held by %s", path, holder(path) or "another process")
            fcntl.flock(fd, operation)
        yield fd
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def holder(path: Path) -> str:
    """Who took the lock last (host and pid), for messages; empty when unknown."""
    with contextlib.suppress(OSError):
        return path.read_text().strip()
    return ""
