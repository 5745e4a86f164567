"""Content hashes: of bytes, files and directory trees, canonical JSON, and a reader that
hashes what it reads."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

_CHUNK = 8 << 20


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def tree_sha256(root: str | os.PathLike, file_sha256: Callable[[Path], str] = sha256_file) -> str:
    """One hash over every file below `root` (relative names and contents)."""
    root = Path(root)
    files = sorted(p for p in root.rglob("*") if p.is_file())
    listing = [[p.relative_to(root).as_posix(), file_sha256(p)] for p in files]
    return sha256_bytes(canonical_json(listing).encode())


def source_sha256(path: str | os.PathLike) -> str:
    """A source's content hash as the plan computes it (a file, or a directory's tree),
    read now rather than looked up in the hash cache."""
    return tree_sha256(path) if Path(path).is_dir() else sha256_file(path)


class HashingReader:
    """A binary file whose bytes are hashed as they are read, so that what a job parsed is
    exactly what it checks: `sha256()` after the last read (it reads what is left first)."""

    def __init__(self, handle: BinaryIO) -> None:
        self._handle = handle
        self._digest = hashlib.sha256()

    def readline(self, limit: int = -1) -> bytes:
        data = self._handle.readline(limit)
        self._digest.update(data)
        return data

    def sha256(self) -> str:
        while chunk := self._handle.read(_CHUNK):
            self._digest.update(chunk)
        return self._digest.hexdigest()
