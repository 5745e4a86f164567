"""Sample addresses, stage keys and the hash cache (the content hashes themselves are
`fsutil.digests`).

A stage key is derived from the stage's semantic parameters, its format version
and the keys or content hashes of its inputs. It never depends on mtimes or on
source text, so editing a comment invalidates nothing, while bumping a stage's
format version (in `keys.STAGE_VERSIONS`) invalidates exactly that stage and
everything downstream of it.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from draftsmith.fsutil.digests import canonical_json, sha256_bytes, sha256_file, tree_sha256

KEY_LENGTH = 16


def sample_address(input_ids: Any, loss_mask: Any) -> str:
    """A sample's address in a hidden-state store: sha256 of its token ids (int32
    little-endian) then its loss mask (one byte per token). The states depend on the ids
    alone; the mask is part of the stored row, so a sample whose mask differs is another
    row. Lists, numpy arrays and CPU tensors give the same address."""
    import numpy as np

    digest = hashlib.sha256(np.asarray(input_ids, dtype="<i4").tobytes())
    digest.update(np.asarray(loss_mask, dtype=np.uint8).tobytes())
    return digest.hexdigest()


def derive_key(payload: dict[str, Any]) -> str:
    return sha256_bytes(canonical_json(payload).encode())[:KEY_LENGTH]


class HashCache:
    """sha256 of source files, cached by (path, size, mtime_ns, inode).

    Keys are computed whenever the Snakefile is parsed (every dry run), so large
    dataset files are hashed once and then looked up.
    """

    def __init__(self, cache_file: str | os.PathLike) -> None:
        self.cache_file = Path(cache_file)
        self._entries: dict[str, dict] = {}
        self._dirty = False
        if self.cache_file.exists():
            try:
                self._entries = json.loads(self.cache_file.read_text())
            except (OSError, json.JSONDecodeError):
                self._entries = {}

    def sha256(self, path: str | os.PathLike) -> str:
        resolved = str(Path(path).resolve())
        stat = os.stat(resolved)
        stamp = [stat.st_size, stat.st_mtime_ns, stat.st_ino]
        entry = self._entries.get(resolved)
        if entry and entry["stamp"] == stamp:
            return entry["sha256"]
        digest = sha256_file(resolved)
        self._entries[resolved] = {"stamp": stamp, "sha256": digest}
        self._dirty = True
        return digest

    def tree_sha256(self, root: str | os.PathLike) -> str:
        """One hash over every file below `root` (relative names and contents)."""
        return tree_sha256(root, self.sha256)

    def save(self) -> None:
        if not self._dirty:
            return
        from draftsmith.fsutil.atomic import write_json

        try:
            write_json(self.cache_file, self._entries)
        except OSError as exc:
            if exc.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
                raise
            # A read-only store is still planned and read: the digests are recomputed.
        self._dirty = False
