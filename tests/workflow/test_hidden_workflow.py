"""Hidden-state extraction through the real workflow: the dry-run preview, kill -9,
corruption, and a sample's states extracted once across mixes."""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import planned_jobs, snakemake, snakemake_cmd, workflow_config, write_rows

from draftsmith.fsutil import atomic
from draftsmith.workflow import configure

pytestmark = pytest.mark.slow

PROMPTS = [f"Tell me one fact about the number {i}." for i in range(16)]
NUM_SHARDS = 6


def config_for(work: Path, model_dir: Path) -> dict:
    config = workflow_config(work, model_dir, {"facts": write_rows(work / "facts.jsonl", PROMPTS)})
    config["generation"]["max_new_tokens"] = 32
    config["extract"] = {"num_shards": NUM_SHARDS, "batch_tokens": 256, "storage": "raw"}
    return config


def shard_files(hidden: Path) -> dict[str, tuple[int, int, bytes]]:
    return {
        p.name: (p.stat().st_ino, p.stat().st_mtime_ns, p.read_bytes())
        for p in sorted(hidden.glob("shard-*"))
    }


def planned(config: dict):
    return configure(copy.deepcopy(config)).plan


def states_dir(config: dict) -> Path:
    return planned(config).states.directory


def view(config: dict) -> dict:
    """The mix's view of the states store (sample -> address -> shard)."""
    return json.loads(planned(config).hidden.path("assignment").read_text())


def test_dry_run_shows_the_assign_job_then_every_extraction_job(tmp_path, demo_model_dir):
    config = config_for(tmp_path, demo_model_dir)
    before = snakemake(tmp_path, config, "hidden", "-n")
    plan = planned_jobs(before)
    # Before the data exists, the shard jobs are not known: the assign job (a checkpoint) is.
    assert plan["hidden_assign"] == 1 and plan["responses"] == 1 and "hidden_shard" not in plan
    assert "checkpoint jobs" in before.stdout + before.stderr
    snakemake(tmp_path, config, "hidden_assign")
    assert planned_jobs(snakemake(tmp_path, config, "hidden", "-n")) == {
        "hidden_shard": NUM_SHARDS,
        "hidden_estimate": 1,
        "hidden": 1,
    }


def test_kill9_mid_extraction_rebuilds_only_unfinished_shards(tmp_path, demo_model_dir):
    config = config_for(tmp_path, demo_model_dir)
    snakemake(tmp_path, config, "merged", "hidden_estimate")
    report = json.loads(next((tmp_path / "results").rglob("hidden_estimate.json")).read_text())
    assert report["shards_to_extract"] == NUM_SHARDS and report["stored_samples"] == 0
    assert report["tokens"] == report["mix_tokens"] > 0
    assert report["bytes_by_mode"]["fp8"] < report["bytes_by_mode"]["raw"]
    hidden = states_dir(config)
    names = view(config)["shards"]

    cmd = snakemake_cmd(tmp_path, tmp_path / "config.yaml", "hidden")
    runner = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    deadline = time.monotonic() + 300
    while (
        len(list(hidden.glob("shard-*.json"))) < 2 and time.monotonic() < deadline and runner.poll() is None
    ):
        time.sleep(0.05)
    os.killpg(runner.pid, signal.SIGKILL)  # snakemake and the running job, like a crashed node
    runner.wait()
    finished = shard_files(hidden)
    done = {n[: -len(".json")] for n in finished if n.endswith(".json")}
    assert 2 <= len(done) < NUM_SHARDS, "the kill should land mid-extraction"
    # Every final name belongs to a complete shard: each .bin has its index, and vice versa.
    assert {n.rsplit(".", 1)[0] for n in finished} == done

    snakemake(tmp_path, config, "--unlock")
    logs = tmp_path / "logs" / "hidden_shard" / hidden.name
    first_logs = {p.name: p.read_text() for p in logs.glob("*.log")}
    # A shard killed between its last write and Snakemake's bookkeeping looks
    # incomplete to Snakemake: its job may rerun, but must reuse the staged shard.
    planned = planned_jobs(snakemake(tmp_path, config, "hidden", "-n"))["hidden_shard"]
    assert NUM_SHARDS - len(done) <= planned <= NUM_SHARDS - len(done) + 1
    snakemake(tmp_path, config, "hidden")
    after = shard_files(hidden)
    for shard in sorted(done):
        log = (logs / f"{shard}.log").read_text()
        rerun = log != first_logs[f"{shard}.log"]
        # A rerun job keeps the finished files: found complete, or re-linked from staging.
        assert not rerun or "already built" in log or "reusing the verified output" in log
        for name in (f"{shard}.bin", f"{shard}.json"):
            # Same inode and bytes; a relinked shard's mtime is Snakemake's to touch.
            assert after[name][::2] == finished[name][::2] and (rerun or after[name] == finished[name])
    for shard in sorted(set(names) - done):
        assert f"extract {shard}" in (logs / f"{shard}.log").read_text()
    assert len([n for n in after if n.endswith(".json")]) == NUM_SHARDS
    assert not list(hidden.glob(".tmp-*"))

    # Corrupt one finished shard: verify names it, the rerun rebuilds exactly it.
    victim = hidden / f"{names[1]}.bin"
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    verify = [sys.executable, "-m", "draftsmith", "verify", str(tmp_path / "artifacts"), "--fix"]
    fixed = subprocess.run(verify, capture_output=True, text=True)
    assert fixed.returncode == 1 and names[1] in fixed.stdout
    targets = fixed.stdout.split("snakemake ", 1)[1].split()
    assert planned_jobs(snakemake(tmp_path, config, *targets, "-n")) == {"hidden_shard": 1}
    snakemake(tmp_path, config, *targets)
    rebuilt = shard_files(hidden)
    assert rebuilt[f"{names[1]}.bin"][2] == after[f"{names[1]}.bin"][2]  # deterministic: same bytes again
    assert {k: v for k, v in rebuilt.items() if names[1] not in k} == {
        k: v for k, v in after.items() if names[1] not in k
    }


def extracted(result, hidden: Path, before: set[str]) -> tuple[int, int]:
    """(hidden_shard jobs run, tokens forwarded) by one run: the new shards' tokens. The
    shard jobs join the DAG after the checkpoint, so they are counted as they start."""
    jobs = (result.stdout + result.stderr).count("rule hidden_shard:")
    new = [p for p in hidden.glob("shard-*.json") if p.name not in before]
    return jobs, sum(json.loads(p.read_text())["num_tokens"] for p in new)


def test_a_sample_is_extracted_once_whatever_mix_holds_it(tmp_path, demo_model_dir):
    config = config_for(tmp_path, demo_model_dir)
    config["datasets"]["more"] = {
        "path": str(write_rows(tmp_path / "more.jsonl", PROMPTS[:5])),
        "format": "prompt",
    }
    config["datasets"]["more"]["generation"] = {"max_new_tokens": 8}  # other answers: other samples
    snakemake(tmp_path, config, "hidden")
    hidden = states_dir(config)
    first = {p.name for p in hidden.glob("shard-*")}
    assert len(first) == 2 * NUM_SHARDS
    state = shard_files(hidden)

    def rerun(changed: dict) -> tuple[int, int]:
        before = {p.name for p in hidden.glob("shard-*.json")}
        return extracted(snakemake(tmp_path, changed, "hidden"), hidden, before)

    reshuffled = {**config, "merge": {"seed": 1}}
    assert rerun(reshuffled) == (0, 0)
    assert view(reshuffled)["stored_samples"] == view(config)["distinct_samples"]
    dropped = {**config, "datasets": {"facts": config["datasets"]["facts"]}}
    assert rerun(dropped) == (0, 0)
    renamed = {**config, "experiment": "other"}
    assert rerun(renamed) == (0, 0)
    assert shard_files(hidden) == state  # not one stored byte rewritten

    added = {
        **config,
        "datasets": {
            **config["datasets"],
            "extra": {
                "path": str(write_rows(tmp_path / "extra.jsonl", ["Name a colour.", "Say one word."])),
                "format": "prompt",
            },
        },
    }
    jobs, tokens = rerun(added)
    extra = atomic.read_jsonl(planned(added).tokens["extra"].path("tokens"))
    assert jobs >= 1 and tokens == sum(len(r["input_ids"]) for r in extra)
    assert {k: v for k, v in shard_files(hidden).items() if k in state} == state
    # The added mix reads shards of both extractions.
    shards, earlier = set(view(added)["shards"]), {n[: -len(".json")] for n in first if n.endswith(".json")}
    assert shards & earlier and shards - earlier
