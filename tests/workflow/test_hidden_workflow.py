"""Hidden-state extraction through the real workflow: dry-run preview, kill -9, corruption."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import planned_jobs, snakemake, snakemake_cmd, workflow_config, write_rows

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


def test_dry_run_previews_every_extraction_job(tmp_path, demo_model_dir):
    plan = planned_jobs(snakemake(tmp_path, config_for(tmp_path, demo_model_dir), "hidden", "-n"))
    assert plan["hidden_shard"] == NUM_SHARDS and plan["hidden_assign"] == 1 and plan["responses"] == 1


def test_kill9_mid_extraction_rebuilds_only_unfinished_shards(tmp_path, demo_model_dir):
    config = config_for(tmp_path, demo_model_dir)
    snakemake(tmp_path, config, "merged", "hidden_estimate")
    report = json.loads(next((tmp_path / "results").rglob("hidden_estimate.json")).read_text())
    assert report["shards"] == NUM_SHARDS and report["bytes_by_mode"]["fp8"] < report["bytes_by_mode"]["raw"]
    hidden = next((tmp_path / "artifacts" / "hidden").iterdir())

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
    for shard in sorted(set(f"shard-{i:05d}" for i in range(NUM_SHARDS)) - done):
        assert f"extract {shard}" in (logs / f"{shard}.log").read_text()
    assert len([n for n in after if n.endswith(".json")]) == NUM_SHARDS
    assert not list(hidden.glob(".tmp-*"))

    # Corrupt one finished shard: verify names it, the rerun rebuilds exactly it.
    victim = hidden / "shard-00001.bin"
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    verify = [sys.executable, "-m", "draftsmith", "verify", str(tmp_path / "artifacts"), "--fix"]
    fixed = subprocess.run(verify, capture_output=True, text=True)
    assert fixed.returncode == 1 and "shard-00001" in fixed.stdout
    targets = fixed.stdout.split("snakemake ", 1)[1].split()
    assert planned_jobs(snakemake(tmp_path, config, *targets, "-n")) == {"hidden_shard": 1}
    snakemake(tmp_path, config, *targets)
    rebuilt = shard_files(hidden)
    assert rebuilt["shard-00001.bin"][2] == after["shard-00001.bin"][2]  # deterministic: same bytes again
    assert {k: v for k, v in rebuilt.items() if "00001" not in k} == {
        k: v for k, v in after.items() if "00001" not in k
    }
