"""Staged outputs: finished work that survives Snakemake deleting a job's outputs.

Snakemake deletes a job's declared outputs before it reruns the job, and a kill between
a job's last write and Snakemake's bookkeeping makes finished outputs look incomplete.
Long jobs (hidden-state shards, training segments) therefore write under `.staged/`
(not a declared output), record what they wrote, and hard-link it into place. A rerun
whose record matches (same key, same inputs, every file's sha256 and size) re-links the
verified bytes instead of recomputing hours of work.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from draftsmith.fsutil import atomic
from draftsmith.fsutil.digests import sha256_file
from draftsmith.store.layout import STAGED

log = logging.getLogger(__name__)


class Staged:
    """The staged files of one job: `<artifact>/.staged/<name of each declared output>`."""

    def __init__(self, declared: list[str | os.PathLike], job: str, identity: dict) -> None:
        self.declared = [Path(p) for p in declared]
        self.directory = self.declared[0].parent / STAGED
        self.job = job
        self.identity = identity  # what the staged files were computed from (key, inputs)
        self.record = self.directory / f"{job}.record.json"

    def path(self, declared: str | os.PathLike) -> Path:
        """Where the job writes the file it declares as `declared`."""
        return self.directory / Path(declared).name

    def reuse(self) -> bool:
        """Link files an earlier run finished into place when they are what this job would write."""
        try:
            record = json.loads(self.record.read_text())
        except (OSError, ValueError):
            return False
        if record.get("identity") != self.identity:
            return False
        for name, expected in record["files"].items():
            path = self.directory / name
            if (
                not path.exists()
                or path.stat().st_size != expected["size"]
                or sha256_file(path) != expected["sha256"]
            ):
                return False
        self._link()
        log.info("%s: reusing the verified output finished by an earlier run", self.job)
        return True

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.record.unlink(missing_ok=True)

    def finish(self, known_sha256: dict[str, str] | None = None) -> None:
        """Record the finished files, then link them into place. `known_sha256` gives the
        digests a writer already computed (by file name): a large file is not read again."""
        known = known_sha256 or {}
        files = {}
        for declared in self.declared:
            path = self.path(declared)
            digest = known.get(path.name) or sha256_file(path)
            files[path.name] = {"sha256": digest, "size": path.stat().st_size}
        atomic.write_json(self.record, {"identity": self.identity, "files": files})
        self._link()

    def _link(self) -> None:
        for declared in self.declared:
            declared.unlink(missing_ok=True)
            os.link(self.path(declared), declared)
        atomic.fsync_dir(self.declared[0].parent)
