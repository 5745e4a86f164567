"""Atomic artifact writes: temp file in the same directory, fsync, rename.

A crash at any point leaves either the previous file or no file under the final
name, never a partial one; `atomic_dir` does the same for a whole directory. Temp
names start with '.tmp-' so `verify` and globbing code can tell them apart.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

TMP_PREFIX = ".tmp-"


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
    fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX + final.name + ".", dir=final.parent)
    os.close(fd)
    try:
        with open(tmp, mode, **kwargs) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, final)
        fsync_dir(final.parent)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
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
    tmp = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{final.name}.", dir=final.parent))
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
        old = final.parent / f"{TMP_PREFIX}{final.name}.old-{uuid.uuid4().hex[:8]}"
        os.rename(final, old)
    os.rename(tmp, final)
    fsync_dir(final.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
