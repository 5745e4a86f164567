"""Append-only JSONL journals for resumable stages.

Journals live beside, never inside, a stage's declared outputs: Snakemake deletes
declared outputs before a job starts, so resumable state must not be one. Each
record is flushed and fsynced as it completes; a torn last line from a kill -9 is
ignored on reload.
"""

from __future__ import annotations

import json
import os
from pathlib import Path


def complete_records(raw: bytes) -> tuple[list[dict], int]:
    """The records of a journal's bytes before its first torn line, and where they end."""
    records, good_end = [], 0
    for line in raw.splitlines(keepends=True):
        if not line.endswith(b"\n"):
            break
        try:
            records.append(json.loads(line))
        except (json.JSONDecodeError, UnicodeDecodeError):
            break
        good_end += len(line)
    return records, good_end


class Journal:
    def __init__(self, path: str | os.PathLike, id_field: str = "id") -> None:
        self.path = Path(path)
        self.id_field = id_field
        self.records: dict[str, dict] = {}
        self.torn_lines = 0
        if self.path.exists():
            self._load()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._handle = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (closed in close())

    def _load(self) -> None:
        raw = self.path.read_bytes()
        records, good_end = complete_records(raw)
        self.torn_lines = int(good_end != len(raw))
        for record in records:
            self.records[record[self.id_field]] = record
        if good_end != len(raw):
            # Drop the torn tail so new records start on a clean line.
            with open(self.path, "r+b") as handle:
                handle.truncate(good_end)

    def __contains__(self, record_id: str) -> bool:
        return record_id in self.records

    def append(self, record: dict) -> bool:
        """Write a record whose id is not yet journaled; False (nothing written) when it is.
        One process writes a journal at a time (it holds its job's store lock)."""
        if record[self.id_field] in self.records:
            return False
        self._handle.write(json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n")
        self._handle.flush()
        os.fsync(self._handle.fileno())
        self.records[record[self.id_field]] = record
        return True

    def close(self) -> None:
        self._handle.close()
