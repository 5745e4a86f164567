"""Dataset sources: JSONL (each line read no further than a bound), Parquet and
`save_to_disk` directories, as (line, raw row) pairs; a raw row as an object."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from draftsmith.errors import DatasetError
from draftsmith.formats.datasets.rows import Bad
from draftsmith.fsutil.digests import HashingReader, source_sha256

JSONL_SUFFIXES = (".jsonl", ".json")
PARQUET_BATCH_ROWS = 1024
UTF8_BOM = b"\xef\xbb\xbf"
READ_CHUNK_BYTES = 1 << 20


@dataclass
class Source:
    rows: Iterator[tuple[int | None, Any]]  # (1-based line or None, raw row)
    total: int | None  # row count when known without reading the rows
    path: Path

    def sha256(self) -> str:
        """The content hash of what was read (a file or directory read by a library: hashed
        again once it is read)."""
        return source_sha256(self.path)

    def close(self) -> None:
        pass


@dataclass
class _JsonlSource(Source):
    reader: HashingReader | None = None
    handle: BinaryIO | None = None

    def sha256(self) -> str:
        return self.reader.sha256()  # the bytes the rows were parsed from, read once

    def close(self) -> None:
        self.handle.close()


@dataclass
class _LongLine:
    """A JSONL line longer than the line bound, read past without being kept."""

    size: int
    limit: int


def open_source(name: str, path: Path, split: str | None, max_line_bytes: int) -> Source:
    if not path.exists():
        raise DatasetError(f"dataset {name!r}: {path} does not exist")
    if path.is_dir():
        return _hf_source(name, path, split)
    suffix = path.suffix.lower()
    if suffix in JSONL_SUFFIXES:
        handle = path.open("rb")
        reader = HashingReader(handle)
        return _JsonlSource(_jsonl_rows(reader, max_line_bytes), None, path, reader, handle)
    if suffix == ".parquet":
        return _parquet_source(name, path)
    raise DatasetError(
        f"dataset {name!r}: {path}: unsupported file type {suffix or '(none)'!r} "
        "(expected .jsonl, .json, .parquet or a save_to_disk directory)"
    )


def _jsonl_rows(f: HashingReader, max_line_bytes: int) -> Iterator[tuple[int, bytes | _LongLine]]:
    # Bytes, not text: a line of invalid UTF-8 must be a bad row, not a crash.
    for number, raw in enumerate(iter(lambda: f.readline(max_line_bytes + 1), b""), start=1):
        if len(raw) > max_line_bytes and not raw.endswith(b"\n"):
            yield number, _LongLine(len(raw) + _skip_line(f), max_line_bytes)
            continue
        if number == 1 and raw.startswith(UTF8_BOM):
            raw = raw[len(UTF8_BOM) :]
        if raw.strip():
            yield number, raw.rstrip(b"\r\n")


def _skip_line(f: HashingReader) -> int:
    """Read to the end of the current line in bounded chunks; the bytes before its end."""
    skipped = 0
    while chunk := f.readline(READ_CHUNK_BYTES):
        if chunk.endswith(b"\n"):
            return skipped + len(chunk.rstrip(b"\r\n"))
        skipped += len(chunk)
    return skipped


def _parquet_source(name: str, path: Path) -> Source:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        file = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as exc:
        raise DatasetError(f"dataset {name!r}: {path}: not a readable Parquet file: {exc}") from exc

    def rows() -> Iterator[tuple[None, dict]]:
        for batch in file.iter_batches(batch_size=PARQUET_BATCH_ROWS):
            for row in batch.to_pylist():
                yield None, row

    return Source(rows(), file.metadata.num_rows, path)


def _hf_source(name: str, path: Path, split: str | None) -> Source:
    import datasets

    try:
        loaded = datasets.load_from_disk(str(path))
    except FileNotFoundError as exc:
        raise DatasetError(
            f"dataset {name!r}: {path}: not a directory written by datasets' save_to_disk: {exc}"
        ) from exc
    if isinstance(loaded, datasets.DatasetDict):
        loaded = _pick_split(name, path, loaded, split)
    # A saved format (e.g. torch) would turn strings into tensors; read plain Python.
    table = loaded.with_format(None)
    return Source(((None, row) for row in table), len(table), path)


def _pick_split(name: str, path: Path, splits: Any, split: str | None) -> Any:
    available = ", ".join(sorted(splits))
    if split is None:
        raise DatasetError(
            f"dataset {name!r}: {path} is a DatasetDict with splits [{available}]; "
            f"set datasets.{name}.split to one of them"
        )
    if split not in splits:
        raise DatasetError(f"dataset {name!r}: {path}: split {split!r} not found (available: {available})")
    return splits[split]


def as_object(raw: Any) -> dict:
    if isinstance(raw, _LongLine):
        detail = f"line has {raw.size} bytes, over the {raw.limit}-byte bound on a row (not parsed)"
        raise Bad("over-long", None, detail)
    if isinstance(raw, bytes):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise Bad("invalid-utf8", None, f"invalid UTF-8 at byte {exc.start}") from None
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            detail = f"invalid JSON: {exc.msg} (column {exc.colno})"
            raise Bad("bad-json", None, detail) from None
        except RecursionError:
            raise Bad("bad-json", None, "invalid JSON: nested too deeply to parse") from None
    if not isinstance(raw, dict):
        raise Bad("not-an-object", None, f"expected a JSON object, got {type(raw).__name__}")
    return raw
