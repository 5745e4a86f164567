"""Crash safety: atomic writes, resumable journals, manifests and `verify`."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from draftsmith.fsutil import atomic
from draftsmith.store import manifest, verify
from draftsmith.store.journal import Journal
from draftsmith.store.layout import MANIFEST
from draftsmith.store.plan import Artifact


class Boom(Exception):
    pass


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith(atomic.TMP_PREFIX))


# --- atomic --------------------------------------------------------------------
def test_atomic_open_failure_leaves_nothing(tmp_path):
    target = tmp_path / "sub" / "out.txt"
    with pytest.raises(Boom), atomic.atomic_open(target) as handle:
        handle.write("partial")
        raise Boom
    assert not target.exists()
    assert leftovers(target.parent) == []
    assert list(target.parent.iterdir()) == []


def test_atomic_open_failure_keeps_previous_content(tmp_path):
    target = tmp_path / "out.json"
    atomic.write_json(target, {"version": 1})
    with pytest.raises(Boom), atomic.atomic_open(target) as handle:
        handle.write('{"version": 2, "trunc')
        raise Boom
    assert json.loads(target.read_text()) == {"version": 1}
    assert leftovers(tmp_path) == []


def test_atomic_open_writes_under_a_temp_name_until_done(tmp_path):
    target = tmp_path / "out.txt"
    with atomic.atomic_open(target) as handle:
        handle.write("body")
        handle.flush()
        assert not target.exists()
        temps = leftovers(tmp_path)
        assert len(temps) == 1 and temps[0].startswith(atomic.temp_prefix("out.txt"))
    assert target.read_text() == "body"
    assert leftovers(tmp_path) == []
    assert target.stat().st_mode & 0o777 == 0o644


def test_atomic_binary_mode(tmp_path):
    target = tmp_path / "blob.bin"
    with atomic.atomic_open(target, "wb") as handle:
        handle.write(b"\x00\xff")
    assert target.read_bytes() == b"\x00\xff"


def test_write_jsonl_read_jsonl_roundtrip(tmp_path):
    records = [{"id": "a", "text": "héllo ✓"}, {"id": "b", "input_ids": [1, 2, 3]}, {}]
    path = tmp_path / "records.jsonl"
    assert atomic.write_jsonl(path, iter(records)) == 3
    assert list(atomic.read_jsonl(path)) == records
    assert len(path.read_text(encoding="utf-8").splitlines()) == 3


def test_read_jsonl_skips_blank_lines(tmp_path):
    path = tmp_path / "records.jsonl"
    path.write_text('{"a": 1}\n\n  \n{"a": 2}\n')
    assert list(atomic.read_jsonl(path)) == [{"a": 1}, {"a": 2}]


def test_read_jsonl_names_path_and_line_of_a_corrupt_record(tmp_path):
    path = tmp_path / "records.jsonl"
    path.write_text('{"a": 1}\n{"a": 2}\n{"a": 3, \n{"a": 4}\n')
    with pytest.raises(ValueError, match=rf"^{path}:3: corrupt JSON record"):
        list(atomic.read_jsonl(path))


def test_write_jsonl_failure_mid_stream_keeps_previous_file(tmp_path):
    path = tmp_path / "records.jsonl"
    atomic.write_jsonl(path, [{"n": 0}])

    def records():
        yield {"n": 1}
        raise Boom

    with pytest.raises(Boom):
        atomic.write_jsonl(path, records())
    assert list(atomic.read_jsonl(path)) == [{"n": 0}]
    assert leftovers(tmp_path) == []


# --- journal -------------------------------------------------------------------
def test_journal_append_and_reload(tmp_path):
    path = tmp_path / "state" / "journal.jsonl"
    journal = Journal(path)
    journal.append({"id": "a", "text": "one"})
    journal.append({"id": "b", "text": "two"})
    assert "a" in journal and "c" not in journal
    journal.close()
    reloaded = Journal(path)
    assert reloaded.records == {"a": {"id": "a", "text": "one"}, "b": {"id": "b", "text": "two"}}
    assert reloaded.torn_lines == 0
    reloaded.close()


def test_journal_custom_id_field(tmp_path):
    journal = Journal(tmp_path / "j.jsonl", id_field="key")
    journal.append({"key": "k1"})
    journal.close()
    assert "k1" in Journal(tmp_path / "j.jsonl", id_field="key")


def test_journal_drops_a_torn_last_line_and_appends_cleanly(tmp_path):
    path = tmp_path / "journal.jsonl"
    journal = Journal(path)
    journal.append({"id": "a"})
    journal.append({"id": "b"})
    journal.close()
    clean = path.read_bytes()
    with path.open("ab") as handle:
        handle.write(b'{"id": "c", "text": "half writ')  # kill -9 mid-record
    reloaded = Journal(path)
    assert reloaded.torn_lines == 1
    assert set(reloaded.records) == {"a", "b"}
    assert path.read_bytes() == clean  # the torn tail is gone from disk
    reloaded.append({"id": "c", "text": "whole"})
    reloaded.close()
    lines = path.read_bytes().splitlines(keepends=True)
    assert [json.loads(line)["id"] for line in lines] == ["a", "b", "c"]
    assert all(line.endswith(b"\n") for line in lines)
    final = Journal(path)
    assert final.torn_lines == 0
    assert final.records["c"] == {"id": "c", "text": "whole"}
    final.close()


def test_journal_complete_json_without_newline_is_torn(tmp_path):
    # The fsync may have covered the record but not its newline: treat it as torn.
    path = tmp_path / "journal.jsonl"
    path.write_bytes(b'{"id": "a"}\n{"id": "b"}')
    journal = Journal(path)
    assert journal.torn_lines == 1
    assert set(journal.records) == {"a"}
    journal.append({"id": "b"})
    journal.close()
    assert path.read_bytes() == b'{"id": "a"}\n{"id":"b"}\n'


def test_journal_torn_multibyte_tail(tmp_path):
    path = tmp_path / "journal.jsonl"
    path.write_bytes(b'{"id": "a"}\n' + '{"id": "b", "t": "✓'.encode()[:-1])
    journal = Journal(path)
    assert journal.torn_lines == 1 and set(journal.records) == {"a"}
    journal.close()


# --- manifest and verify ---------------------------------------------------------
@pytest.fixture
def artifact(tmp_path: Path) -> Path:
    """An artifact directory with two files, a nested directory and its manifest."""
    out = tmp_path / "artifacts" / "tokens" / "chat" / "0123456789abcdef"
    atomic.write_jsonl(out / "tokens.jsonl", [{"input_ids": [1, 2, 3]}, {"input_ids": [4]}])
    atomic.write_text(out / "shards" / "part-0.txt", "shard zero\n")
    manifest.write(
        Artifact("tokens", {"max_length": 512}, {"model": "m" * 16}, out, "0123456789abcdef"),
        out / MANIFEST,
        [out / "tokens.jsonl", out / "shards"],
        {"samples": 2},
        time.time() - 1,
    )
    return out


def test_manifest_describes_every_file(artifact):
    written = manifest.read(artifact / MANIFEST)
    assert set(written["files"]) == {"tokens.jsonl", "shards/part-0.txt"}
    tokens = written["files"]["tokens.jsonl"]
    assert tokens["size"] == (artifact / "tokens.jsonl").stat().st_size
    assert len(tokens["sha256"]) == 64
    assert written["stage"] == "tokens" and written["key"] == "0123456789abcdef"
    assert written["params"] == {"max_length": 512} and written["stats"] == {"samples": 2}
    assert written["versions"]["python"]
    assert written["wall_s"] >= 1


def test_intact_artifact_checks_clean(artifact):
    assert manifest.check(artifact / MANIFEST) == []


def flip_one_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def test_check_flags_a_flipped_byte(artifact):
    flip_one_byte(artifact / "tokens.jsonl")
    assert manifest.check(artifact / MANIFEST) == [f"{artifact / 'tokens.jsonl'}: sha256 mismatch"]


def test_check_flags_truncation(artifact):
    target = artifact / "shards" / "part-0.txt"
    size = target.stat().st_size
    target.write_bytes(target.read_bytes()[:3])
    problems = manifest.check(artifact / MANIFEST)
    assert problems == [f"{target}: size 3 != {size}"]


def test_check_flags_deletion(artifact):
    (artifact / "tokens.jsonl").unlink()
    assert manifest.check(artifact / MANIFEST) == [f"{artifact / 'tokens.jsonl'}: missing"]


def test_check_flags_an_unreadable_manifest(artifact):
    (artifact / MANIFEST).write_text("{torn")
    (problem,) = manifest.check(artifact / MANIFEST)
    assert "unreadable manifest" in problem


def test_verify_finds_and_quarantines_the_corrupt_artifact(tmp_path, artifact):
    root = tmp_path / "artifacts"
    healthy = root / "responses" / "chat" / "fedcba9876543210"
    atomic.write_text(healthy / "responses.jsonl", "{}\n")
    manifest.write(
        Artifact("responses", {}, {}, healthy, "fedcba9876543210"),
        healthy / MANIFEST,
        [healthy / "responses.jsonl"],
        {},
        time.time(),
    )
    flip_one_byte(artifact / "tokens.jsonl")

    checked, findings = verify.scan(root)
    assert checked == 2
    assert [(f.where, f.problems) for f in findings] == [
        (artifact / MANIFEST, [f"{artifact / 'tokens.jsonl'}: sha256 mismatch"])
    ]

    moved = verify.quarantine(findings[0])
    assert sorted(moved) == sorted(
        [artifact / "tokens.jsonl", artifact / "shards" / "part-0.txt", artifact / MANIFEST]
    )
    assert sorted(p.relative_to(artifact).as_posix() for p in artifact.rglob("*") if p.is_file()) == [
        "manifest.json.corrupt",
        "shards/part-0.txt.corrupt",
        "tokens.jsonl.corrupt",
    ]
    # Quarantined outputs are simply missing now; the healthy artifact is untouched.
    assert verify.scan(root) == (1, [])
    assert (healthy / "responses.jsonl").read_text() == "{}\n"


def test_verify_main_reports_and_fixes(tmp_path, artifact, capsys):
    root = tmp_path / "artifacts"
    assert verify.run(root, None, fix=False, configfiles=[]) == 0
    assert "verify: 1 checked, 0 corrupt, 0 missing" in capsys.readouterr().out

    (artifact / "tokens.jsonl").write_bytes(b"")
    assert verify.run(root, None, fix=False, configfiles=[]) == 1
    out = capsys.readouterr().out
    assert f"CORRUPT {artifact / MANIFEST}\n" in out
    assert f"{artifact / 'tokens.jsonl'}: size 0 !=" in out
    assert "1 checked, 1 corrupt" in out and "draftsmith verify --fix" in out
    assert (artifact / "tokens.jsonl").exists()  # without --fix nothing moves

    assert verify.run(root, None, fix=True, configfiles=["my config.yaml"]) == 1
    out = capsys.readouterr().out
    assert "quarantined" in out
    # Paths are quoted: a configfile with a space still gives one argument.
    assert f"snakemake --configfile 'my config.yaml' {artifact / MANIFEST}" in out
    assert (artifact / "tokens.jsonl.corrupt").exists()
    assert not (artifact / MANIFEST).exists()
    assert verify.run(root, None, fix=False, configfiles=[]) == 0
