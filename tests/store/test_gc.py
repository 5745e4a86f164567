"""draftsmith.store.gc and `draftsmith gc`: exactly the directories no given config plans
are listed, and `--delete` removes exactly those, never one a job holds or wrote lately."""

from __future__ import annotations

import copy
import json
import os
import select
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
import yaml
from conftest import stand_in_config

from draftsmith import cli
from draftsmith.formats.shards.writer import ShardWriter
from draftsmith.fsutil import atomic
from draftsmith.fsutil.atomic import TMP_PREFIX
from draftsmith.store import gc, lock, manifest, verify
from draftsmith.store.hashing import sample_address
from draftsmith.store.layout import (
    HASH_CACHE,
    LOCKS,
    MANIFEST,
    shard_name,
    shard_samples_path,
    stored_samples,
)
from draftsmith.store.plan import Artifact, DamagedViewError, Plan
from draftsmith.workflow import configure

STRAY_KEYS = ("0123456789abcdef", "fedcba9876543210")


@pytest.fixture
def configs(tmp_path: Path) -> dict[str, dict]:
    """Two raw configs sharing a store; they differ from the merge on."""
    first = stand_in_config(tmp_path)
    second = copy.deepcopy(first) | {"merge": {"seed": 1}}
    return {"first": first, "second": second}


def config_files(tmp_path: Path, configs: dict[str, dict]) -> dict[str, Path]:
    paths = {name: tmp_path / f"{name}.yaml" for name in configs}
    for name, path in paths.items():
        path.write_text(yaml.safe_dump(configs[name]))
    return paths


def fill(directory: Path, size: int) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "data.bin").write_bytes(b"x" * size)
    return directory


def build_store(plans: list[Plan]) -> tuple[Path, list[Path]]:
    """Every planned directory, strays under key names, and what gc must never take."""
    for plan in plans:
        for artifact in plan.artifacts:
            fill(artifact.directory, 10)
    root = plans[0].root
    strays = [
        fill(root / "train" / STRAY_KEYS[0], 100),
        fill(root / "responses" / "chat" / STRAY_KEYS[1], 1000),
        fill(root / "responses" / "retired" / STRAY_KEYS[0], 5),
    ]
    fill(root / "train" / f"{TMP_PREFIX}{STRAY_KEYS[1]}.x", 1)  # a write in progress
    fill(root / "train" / "notes", 1)  # not named by a key
    fill(root / "draft" / STRAY_KEYS[1], 1)  # not a stage word
    return root, strays


def listed(out: str) -> set[Path]:
    *lines, summary = out.strip().splitlines()
    assert summary.startswith("gc: ")
    return {Path(line.split()[-1]) for line in lines if not line.startswith("skipped")}


def skipped(out: str) -> dict[Path, str]:
    """Directory -> the reason gc gave for leaving it."""
    lines = [line.split(None, 1)[1] for line in out.splitlines() if line.startswith("skipped")]
    return {Path(where): why for where, why in (line.split(": ", 1) for line in lines)}


def age(directory: Path, seconds: float) -> None:
    """Date everything under `directory` (and itself) `seconds` back."""
    then = time.time() - seconds
    for path in [*directory.rglob("*"), directory]:
        os.utime(path, (then, then), follow_symlinks=False)


def snapshot(root: Path) -> set[Path]:
    """The store's files, less the hash cache and the lock files (gc leaves those in place:
    a job may be waiting on one)."""
    return {p for p in root.rglob("*") if p.name != HASH_CACHE and LOCKS not in p.relative_to(root).parts}


def test_gc_lists_only_what_no_config_plans(tmp_path, configs, capsys):
    plans = [configure(copy.deepcopy(c)).plan for c in configs.values()]
    root, strays = build_store(plans)
    age(root, 3600)
    before = snapshot(root)
    paths = config_files(tmp_path, configs)

    assert cli.main(["gc", "--configfile", str(paths["first"]), "--configfile", str(paths["second"])]) == 0
    out = capsys.readouterr().out
    assert listed(out) == set(strays)
    assert "gc: 3 directories unreferenced" in out and "(1,105 bytes)" in out

    # Planned alone, the first config leaves the second's own artifacts unreferenced.
    assert cli.main(["gc", "--configfile", str(paths["first"])]) == 0
    only_second = {a.directory for a in plans[1].artifacts} - {a.directory for a in plans[0].artifacts}
    assert {a.stage for a in plans[1].artifacts if a.directory in only_second} >= {"merged", "train"}
    # Another shuffle of the same samples reads the same states store; only its view is its own.
    assert plans[1].states.directory not in only_second and plans[1].hidden.directory in only_second
    assert listed(capsys.readouterr().out) == set(strays) | only_second
    assert set(root.rglob("*")) - {root / HASH_CACHE} == before  # listing writes nothing, no lock file


def test_gc_lists_a_states_store_no_config_extracts_into(tmp_path, configs, capsys):
    other = copy.deepcopy(configs["first"]) | {"extract": {"storage": "fp8"}}
    plans = [configure(copy.deepcopy(c)).plan for c in [*configs.values(), other]]
    build_store(plans)
    age(plans[0].root, 3600)
    paths = config_files(tmp_path, configs)
    assert cli.main(["gc", "--configfile", str(paths["first"]), "--configfile", str(paths["second"])]) == 0
    unused = listed(capsys.readouterr().out)
    assert plans[2].states.directory in unused and plans[0].states.directory not in unused


def test_gc_delete_removes_exactly_the_unreferenced(tmp_path, configs, capsys):
    plans = [configure(copy.deepcopy(c)).plan for c in configs.values()]
    root, strays = build_store(plans)
    before = snapshot(root)
    paths = config_files(tmp_path, configs)
    args = ["gc", "--configfile", str(paths["first"]), "--configfile", str(paths["second"])]
    age(root, 3600)

    assert cli.main([*args, "--delete"]) == 0
    assert listed(capsys.readouterr().out) == set(strays)
    removed = {p for p in before if any(p == s or s in p.parents for s in strays)}
    assert snapshot(root) == before - removed
    assert not any(p.name.startswith(f"{TMP_PREFIX}{s.name}.gc-") for s in strays for p in snapshot(root))
    assert all(a.directory.is_dir() for plan in plans for a in plan.artifacts)

    assert cli.main([*args, "--delete"]) == 0
    assert capsys.readouterr().out.startswith("gc: 0 directories deleted")


def test_size_counts_a_hard_linked_file_once_and_follows_no_link(tmp_path):
    directory = fill(tmp_path / "artifact", 300)
    os.link(directory / "data.bin", directory / "again.bin")
    (directory / "elsewhere").symlink_to(fill(tmp_path / "other", 5000), target_is_directory=True)
    assert gc.size(directory) == 300


# --- live work: a job's lock and the grace period -----------------------------------------
JOB = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from draftsmith.store import lock
    root, output = Path(sys.argv[1]), Path(sys.argv[2])
    # "held": only the job's own lock, as jobs took it before directory locks
    hold = lock.held(lock.lock_path(root, output)) if sys.argv[4:] else lock.building(root, [output])
    with hold:
        print("held", flush=True)
        time.sleep(float(sys.argv[3]))
    """
)


def job(root: Path, output: Path, seconds: float = 60, *how: str) -> subprocess.Popen:
    """A process that holds the store locks of the job writing `output`, as a job does."""
    command = [sys.executable, "-c", JOB, str(root), str(output), str(seconds), *how]
    return subprocess.Popen(command, stdout=subprocess.PIPE, text=True)


def said_held(proc: subprocess.Popen, timeout_s: float) -> bool:
    ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
    return bool(ready) and proc.stdout.readline().strip() == "held"


def test_gc_spares_a_directory_whose_job_holds_its_lock(tmp_path, configs, capsys):
    plans = [configure(copy.deepcopy(c)).plan for c in configs.values()]
    root, strays = build_store(plans)
    paths = config_files(tmp_path, configs)
    age(root, 3600)
    busy = strays[1]  # responses/chat/<key>: a generation job is writing there
    older = strays[0]  # train/<key>: a job of an older checkout holds only its own lock
    holders = [job(root, busy / "responses.jsonl"), job(root, older / "ckpt-00000.pt", 60, "held")]
    try:
        assert all(said_held(h, 30) for h in holders)
        assert cli.main(["gc", "--delete", "--configfile", str(paths["first"])]) == 0
        out = capsys.readouterr().out
        assert busy.is_dir() and (busy / "data.bin").exists() and older.is_dir()
        assert not {busy, older} & listed(out)
        for directory, holder in zip((busy, older), holders, strict=True):
            assert f"pid {holder.pid}" in skipped(out)[directory] and "lock" in skipped(out)[directory]
        assert not strays[2].exists()  # the unused one went
    finally:
        for holder in holders:
            holder.kill()
            holder.wait()
    assert cli.main(["gc", "--delete", "--configfile", str(paths["first"])]) == 0
    assert listed(capsys.readouterr().out) == {busy, older} and not busy.exists() and not older.exists()


def test_gc_spares_what_was_written_within_the_grace_period(tmp_path, configs, capsys):
    plans = [configure(copy.deepcopy(c)).plan for c in configs.values()]
    root, strays = build_store(plans)
    paths = config_files(tmp_path, configs)
    args = ["gc", "--delete", "--configfile", str(paths["first"]), "--configfile", str(paths["second"])]
    age(root, 3600)
    (strays[0] / "journal.jsonl").write_text("{}\n")  # a job finished there just now

    assert cli.main(args) == 0
    out = capsys.readouterr().out
    assert strays[0].is_dir() and "grace" in skipped(out)[strays[0]]
    assert listed(out) == set(strays[1:]) and not any(s.exists() for s in strays[1:])
    assert "1 skipped" in out.splitlines()[-1]

    assert cli.main([*args, "--grace", "0"]) == 0
    assert listed(capsys.readouterr().out) == {strays[0]} and not strays[0].exists()


def test_a_job_waits_while_gc_removes_its_directory(tmp_path):
    root = tmp_path / "store"
    doomed = fill(root / "train" / STRAY_KEYS[0], 10)
    age(doomed, 3600)
    with gc.claim(root, doomed, grace_s=60) as kept:
        assert kept is None
        waiting = job(root, doomed / "ckpt-00000.pt", 0)
        assert not said_held(waiting, 1.0)  # the job waits for gc
        shutil.rmtree(doomed)  # what gc removes under its claim
    try:
        assert said_held(waiting, 30)  # and goes on once gc is done
        assert waiting.wait(30) == 0
        assert doomed.is_dir()  # the job finds the directory it writes to
    finally:
        waiting.kill()
        waiting.wait()
    assert lock.directory_lock(root, doomed) == root / ".locks" / f"train/{STRAY_KEYS[0]}.lock"


# --- what a killed gc leaves ------------------------------------------------------------------
LARGE_FILES = 10_000


def large_artifact(directory: Path) -> list[Path]:
    """A finished artifact of many files, dated an hour back: gc deletes it at once."""
    files = [directory / f"part-{i:05d}.bin" for i in range(LARGE_FILES)]
    directory.mkdir(parents=True)
    for path in files:
        path.write_bytes(b"x" * 64)
    artifact = Artifact("train", {}, {}, directory, directory.name)
    manifest.write(artifact, directory / MANIFEST, files, {}, time.time())
    age(directory, 3600)
    return files


def kill_gc_midway(config: Path, directory: Path, files: list[Path]) -> Path:
    """Run `draftsmith gc --delete` and kill -9 it once it has deleted a few of the files of
    `directory` (renamed out of its key's name); returns the temporary it leaves."""
    sentinels = files[:: len(files) // 100]
    command = [sys.executable, "-m", "draftsmith", "gc", "--delete", "--configfile", str(config)]
    child = subprocess.Popen(command)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and child.poll() is None:
            temps = list(directory.parent.glob(f"{TMP_PREFIX}{directory.name}.gc@*"))
            if temps and not all((temps[0] / s.name).exists() for s in sentinels):
                child.kill()
                break
    finally:
        child.kill()
        child.wait()
    assert child.returncode == -9 and temps, "gc finished before it could be killed"
    return temps[0]


def test_verify_passes_over_what_a_killed_gc_left_and_the_next_gc_removes_it(tmp_path, configs, capsys):
    plans = [configure(copy.deepcopy(c)).plan for c in configs.values()]
    root, _ = build_store(plans)
    age(root, 3600)
    first = config_files(tmp_path, configs)["first"]
    for attempt in range(3):  # the deletion order is the file system's: the manifest must outlive the kill
        directory = root / "train" / f"{attempt:016x}"
        left = kill_gc_midway(first, directory, large_artifact(directory))
        if (left / MANIFEST).exists():
            break
    assert not directory.exists() and len(list(left.iterdir())) < LARGE_FILES + 1
    capsys.readouterr()

    assert cli.main(["verify", str(root)]) == 0
    out = capsys.readouterr().out
    assert "CORRUPT" not in out and f"STALE {left}" in out
    assert cli.main(["verify", str(root), "--fix"]) == 0
    out = capsys.readouterr().out
    assert "rebuild" not in out and not list(left.glob(f"*{verify.QUARANTINE_SUFFIX}"))

    assert cli.main(["gc", "--delete", "--configfile", str(first)]) == 0
    assert f"removed  {left}" in capsys.readouterr().out
    assert not list(root.rglob(f"{TMP_PREFIX}*.gc@*"))


# --- stored states: per shard ------------------------------------------------------------
def store_shard(store: Path, samples: dict[str, list[int]]) -> str:
    """A finished shard of `samples` (id -> token ids) with its samples file; its name."""
    rows = {sample_address(ids, [1] * len(ids)): ids for ids in samples.values()}
    name = shard_name(list(rows))
    atomic.write_jsonl(
        shard_samples_path(store, name),
        ({"address": a, "input_ids": ids, "loss_mask": [1] * len(ids)} for a, ids in rows.items()),
    )
    with ShardWriter(store, name, mode="raw", hidden_size=2, dtype="float32", meta={}) as writer:
        for address, ids in rows.items():
            writer.add(address, ids, [1] * len(ids), torch.zeros(len(ids), 6), torch.zeros(len(ids), 2))
    return name


def write_view(plan: Plan, samples: dict[str, list[int]], store: Path) -> None:
    """The mix's view: each sample where the store holds it."""
    shard_of = stored_samples(store)
    rows = [
        [i, a, shard_of[a]]
        for i, a in ((i, sample_address(ids, [1] * len(ids))) for i, ids in samples.items())
    ]
    view = plan.hidden.path("assignment")
    view.parent.mkdir(parents=True, exist_ok=True)
    view.write_text(json.dumps({"samples": rows, "shards": sorted({r[2] for r in rows})}))


def test_gc_deletes_the_shards_whose_samples_no_planned_mix_uses(tmp_path, configs, capsys):
    plan = configure(copy.deepcopy(configs["first"])).plan
    store = plan.states.directory
    both = store_shard(store, {"a1": [1, 2], "a2": [3]})  # one sample used, one not
    dropped = store_shard(store, {"b1": [4, 5, 6]})  # a dropped dataset's sample
    used = store_shard(store, {"c1": [7]})
    config = config_files(tmp_path, {"first": configs["first"]})["first"]

    write_view(plan, {"a1": [1, 2], "c1": [7]}, store)
    age(plan.root, 3600)
    (item,) = gc.unused_states([plan])
    assert (item.shards, item.samples, item.kept_samples) == ([dropped], 1, 1)
    assert cli.main(["gc", "--configfile", str(config)]) == 0
    out = capsys.readouterr().out
    assert f"{store}: 1 shards, 1 samples" in out and "1 unused samples stay" in out
    assert cli.main(["gc", "--delete", "--configfile", str(config)]) == 0
    assert "gc: 1 shards of unused samples deleted" in capsys.readouterr().out
    left = {p.name for p in store.rglob("*") if p.is_file()}
    assert not any(dropped in name for name in left)
    assert {f"{both}.bin", f"{both}.json", f"{both}.jsonl", f"{used}.json"} <= left
    assert set(stored_samples(store).values()) == {both, used}
    assert verify.scan(plan.root)[1] == []  # the store left behind is sound


def test_gc_keeps_every_shard_while_a_planned_view_is_not_written(tmp_path, configs):
    plan = configure(copy.deepcopy(configs["first"])).plan
    store_shard(plan.states.directory, {"a1": [1, 2]})
    age(plan.root, 3600)
    (item,) = gc.unused_states([plan])
    assert item.shards == [] and "not assigned yet" in item.kept
    assert gc.remove_states(item, 0) == item.kept and len(stored_samples(plan.states.directory)) == 1


def test_verify_finds_a_damaged_samples_file_and_fix_writes_it_again_from_its_shard(tmp_path, configs):
    plan = configure(copy.deepcopy(configs["first"])).plan
    store = plan.states.directory
    name = store_shard(store, {"a1": [1, 2], "a2": [3]})
    path = shard_samples_path(store, name)
    intact = path.read_bytes()
    rows = list(atomic.read_jsonl(path))
    rows[0]["input_ids"][-1] += 1  # a flipped token id
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    said: list[str] = []
    assert verify.run(plan.root, None, fix=False, configfiles=[], say=said.append) == 1
    assert f"CORRUPT {path}" in said and any("row 1: its ids and mask are not its address" in s for s in said)
    assert verify.run(plan.root, None, fix=True, configfiles=[], say=said.append) == 0
    assert path.read_bytes() == intact and "  written again from its shard" in said
    said.clear()
    assert verify.run(plan.root, None, fix=False, configfiles=[], say=said.append) == 0


def test_a_damaged_view_is_named_and_verify_reports_it_instead_of_failing(tmp_path, configs):
    plan = configure(copy.deepcopy(configs["first"])).plan
    store_shard(plan.states.directory, {"a1": [1, 2]})
    write_view(plan, {"a1": [1, 2]}, plan.states.directory)
    view = plan.hidden.path("assignment")
    view.write_bytes(b"\x9c" + view.read_bytes()[1:])  # a flipped first byte
    with pytest.raises(DamagedViewError, match=f"{view}: damaged.*draftsmith verify --fix"):
        plan.mix_shard_names()
    said: list[str] = []
    assert verify.run(plan.root, plan, fix=False, configfiles=[], say=said.append) == 1
    assert any(s.startswith("verify: ") for s in said)  # it ran to its summary
