"""store.staging: finished outputs survive Snakemake deleting them, and only verified bytes are reused."""

from __future__ import annotations

from pathlib import Path

from draftsmith.fsutil.digests import sha256_file
from draftsmith.store.staging import Staged


def finished(tmp_path: Path, identity: dict) -> tuple[Staged, list[Path]]:
    declared = [tmp_path / "out" / "a.bin", tmp_path / "out" / "a.json"]
    declared[0].parent.mkdir()
    staged = Staged(declared, "a", identity)
    staged.start()
    staged.path(declared[0]).write_bytes(b"states" * 100)
    staged.path(declared[1]).write_text("{}")
    return staged, declared


def test_finish_links_and_a_rerun_reuses_the_same_bytes(tmp_path):
    staged, declared = finished(tmp_path, {"key": "k1"})
    assert not staged.reuse()  # nothing recorded yet
    staged.finish()
    assert all(p.stat().st_ino == staged.path(p).stat().st_ino for p in declared)
    for path in declared:
        path.unlink()  # as Snakemake does before rerunning a job
    again = Staged(declared, "a", {"key": "k1"})
    assert again.reuse() and all(p.exists() for p in declared)


def test_other_inputs_or_changed_bytes_are_not_reused(tmp_path):
    staged, declared = finished(tmp_path, {"key": "k1"})
    staged.finish()
    assert not Staged(declared, "a", {"key": "k2"}).reuse()
    staged.path(declared[0]).write_bytes(b"STATES" * 100)  # same size, other bytes
    assert not Staged(declared, "a", {"key": "k1"}).reuse()


def test_a_digest_the_writer_computed_is_recorded_as_given(tmp_path):
    staged, declared = finished(tmp_path, {"key": "k1"})
    real = sha256_file(staged.path(declared[0]))
    staged.finish({"a.bin": real})
    assert Staged(declared, "a", {"key": "k1"}).reuse()
    staged.finish({"a.bin": "0" * 64})  # a wrong digest is kept, so the check fails later
    assert not Staged(declared, "a", {"key": "k1"}).reuse()
