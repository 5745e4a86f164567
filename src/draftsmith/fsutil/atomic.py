"""Atomic artifact writes: temp file in the same directory, fsync, rename.

A crash at any point leaves either the previous file or no file under the final
name, never a partial one; `atomic_dir` does the same for a whole directory.

Temp names say whose they are: `.tmp-<name>@<host>-<pid>.<random>`. Code that globs
a store tells them apart by the '.tmp-' prefix, and `remove_stale_temps` deletes the
leftovers of a dead process (a kill -9 runs no cleanup) but never a live one's.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import socket
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from draftsmith.errors import DiskFullError

TMP_PREFIX = ".tmp-"
_OWNED = re.compile(r"@(?P<host>[^@/]+)-(?P<pid>[0-9]+)\.[^.@/]*$")
# A temp that names no owner (written before owners were recorded) counts as a
# leftover once it is this old.
UNOWNED_STALE_S = 24 * 3600


# Below this many free bytes a failed write is taken for a full disk: some writers
# (torch.save's zip writer) report it without the OS error.
LOW_DISK_BYTES = 1 << 20


def _os_errors(exc: BaseException):
    while exc is not None:
        if isinstance(exc, OSError):
            yield exc
        exc = exc.__cause__ or exc.__context__


def disk_full(path: str | os.PathLike, exc: BaseException) -> DiskFullError | None:
    """The clear error for a write to `path` that failed with `exc`, when the cause was
    a full disk (or quota); None otherwise."""
    if not isinstance(exc, Exception) or isinstance(exc, DiskFullError):
        return None
    target = Path(path)
    directory = target if target.is_dir() else target.parent
    try:
        free = shutil.disk_usage(directory).free
    except OSError:
        free = None
    no_space = any(e.errno in (errno.ENOSPC, errno.EDQUOT) for e in _os_errors(exc))
    if not no_space and (free is None or free >= LOW_DISK_BYTES):
        return None
    left = "" if free is None else f" ({free:,} bytes free)"
    return DiskFullError(f"disk full at {target}{left}: free space on that file system and rerun ({exc})")


def temp_prefix(name: str) -> str:
    """The start of a temp name for `name` owned by this process (a random suffix follows)."""
    return f"{TMP_PREFIX}{name}@{socket.gethostname()}-{os.getpid()}."


def temp_name(name: str) -> str:
    return temp_prefix(name) + uuid.uuid4().hex[:8]


def pid_alive(pid: int) -> bool:
    """A process of this host that exists and is not a zombie (a zombie holds nothing)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def is_stale_temp(path: Path, now: float | None = None) -> bool:
    """A temp left by a process of this host that is gone; another host's temps are
    never judged (its pids mean nothing here), an ownerless one only by age."""
    if not path.name.startswith(TMP_PREFIX):
        return False
    owner = _OWNED.search(path.name)
    if owner is None:
        try:
            age = (now or time.time()) - path.lstat().st_mtime
        except FileNotFoundError:
            return False
        return age > UNOWNED_STALE_S
    return owner["host"] == socket.gethostname() and not pid_alive(int(owner["pid"]))


def remove_temp(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def remove_stale_temps(directory: Path) -> list[Path]:
    """Delete the stale temps directly in `directory`; returns them."""
    if not directory.is_dir():
        return []
    stale = [p for p in sorted(directory.glob(f"{TMP_PREFIX}*")) if is_stale_temp(p)]
    for path in stale:
        remove_temp(path)
    return stale


def fsync_dir(path: Path) -> None:
    """Persist a rename by syncing the directory entry."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w", **kwargs: Any) -> Iterator[IO]:
    """Open a temp file beside `path`; on clean exit fsync it and rename it into place."""
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=temp_prefix(final.name), dir=final.parent)
    os.close(fd)
    try:
        with open(tmp, mode, **kwargs) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, final)
        fsync_dir(final.parent)
    except BaseException as exc:
        full = disk_full(final, exc)  # before the temp goes: its bytes are what filled the disk
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if full is not None:
            raise full from exc
        raise


def write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_open(path, "w", encoding="utf-8") as handle:
        handle.write(text)


def write_json(path: str | os.PathLike, obj: Any) -> None:
    write_text(path, json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


def write_jsonl(path: str | os.PathLike, records: Any) -> int:
    """Write an iterable of JSON-serialisable records; returns the count."""
    count = 0
    with atomic_open(path, "w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n")
            count += 1
    return count


def read_jsonl(path: str | os.PathLike) -> Iterator[dict]:
    """Read a JSONL artifact written by this package (trusted, so errors are fatal)."""
    with open(path, encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{line_no}: corrupt JSON record ({exc.msg})") from exc


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike) -> Iterator[Path]:
    """Build a directory in a temp directory beside `path`; on clean exit fsync every
    file in it and rename it into place (replacing an older one). On failure the temp
    directory is removed and `path` is left as it was."""
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=temp_prefix(final.name), dir=final.parent))
    try:
        yield tmp
        for member in sorted(tmp.rglob("*")):
            if member.is_file():
                fd = os.open(member, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
                os.chmod(member, 0o644)
        os.chmod(tmp, 0o755)
        fsync_dir(tmp)
        _replace_dir(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _replace_dir(tmp: Path, final: Path) -> None:
    # A directory cannot be renamed over a non-empty one: move the old one aside first.
    old = None
    if final.exists():
        old = final.parent / temp_name(f"{final.name}.old")
        os.rename(final, old)
    os.rename(tmp, final)
    fsync_dir(final.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
