"""Draft training through the real workflow: segments in the dry run, kill -9 mid-segment, exact resume."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import planned_jobs, snakemake, snakemake_cmd, workflow_config, write_rows

pytestmark = pytest.mark.slow

PROMPTS = [f"Tell me one short fact about the number {i}." for i in range(8)]
SEGMENTS = 3


def config_for(work: Path, model_dir: Path) -> dict:
    config = workflow_config(work, model_dir, {"facts": write_rows(work / "facts.jsonl", PROMPTS)})
    config["generation"]["max_new_tokens"] = 24
    config["extract"] = {"num_shards": 2, "batch_tokens": 256}
    config["train"] = {
        "draft_vocab_size": 256,
        "ttt_steps": 3,
        "lr": 1.0e-3,
        "warmup_steps": 1,
        "total_steps": 4 * SEGMENTS,
        "checkpoint_every": 4,
        "batch_tokens": 256,
        "val_fraction": 0.2,
    }
    return config


TIMINGS = ("tok_s", "time_s", "data_wait_s", "timings")


def curve(draft_dir: Path) -> list[tuple]:
    """Every metrics record of every segment, without the timings."""
    records = [
        json.loads(line)
        for i in range(SEGMENTS)
        for line in (draft_dir / f"metrics-{i:05d}.jsonl").read_text().splitlines()
    ]
    return [tuple((k, json.dumps(v)) for k, v in r.items() if k not in TIMINGS) for r in records]


def stat(path: Path) -> tuple[int, int, bytes]:
    return path.stat().st_ino, path.stat().st_mtime_ns, path.read_bytes()


def test_kill9_mid_segment_resumes_exactly(tmp_path, demo_model_dir):
    config = config_for(tmp_path, demo_model_dir)
    plan = planned_jobs(snakemake(tmp_path, config, "train", "export", "-n"))
    assert plan["train_segment"] == SEGMENTS and plan["vocab"] == 1 and plan["train"] == 1
    assert plan["export"] == 1

    # The reference: one uninterrupted run.
    snakemake(tmp_path, config, "train", "export")
    draft_dir = next((tmp_path / "artifacts" / "train").iterdir())
    key = draft_dir.name
    reference = curve(draft_dir)
    reference_weights = (draft_dir / "draft.safetensors").read_bytes()
    summary = json.loads((draft_dir / "train_summary.json").read_text())
    assert summary["steps"] == 4 * SEGMENTS and len(summary["end"]["train"]["acc_pos"]) == 3
    assert summary["end"]["val"]["samples"] >= 1 and summary["tokens_seen"] > 0
    assert json.loads((draft_dir / "draft_config.json").read_text())["draft_vocab_size"] == 256
    vocab = json.loads(next((tmp_path / "artifacts" / "vocab").glob("*/vocab.json")).read_text())
    assert vocab["padded"] > 0 and vocab["coverage"] == 1.0  # few distinct tokens: padded
    exported = next((tmp_path / "artifacts" / "export").iterdir())
    layers = json.loads(next((tmp_path / "artifacts" / "hidden").glob("*/shard-*.json")).read_text())
    sglang = json.loads((exported / "sglang" / "config.json").read_text())
    vllm = json.loads((exported / "vllm" / "config.json").read_text())
    # Each consumer gets the layers the draft was trained on, in its own convention.
    assert (
        sglang["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
        == layers["meta"]["layers"]["output_of_layer"]
    )
    assert vllm["eagle_aux_hidden_state_layer_ids"] == layers["meta"]["layers"]["input_of_layer"]
    export_manifest = json.loads((exported / "manifest.json").read_text())
    assert sorted(export_manifest["stats"]) == ["sglang", "vllm"]
    assert all(
        v["logits_max_abs_diff"] <= v["logits_tolerance"]["atol"] for v in export_manifest["stats"].values()
    )
    verify = [sys.executable, "-m", "draftsmith", "verify", str(tmp_path / "artifacts")]
    assert subprocess.run(verify, capture_output=True, text=True).returncode == 0

    # Train again from nothing, killing snakemake and its job during segment 2.
    shutil.rmtree(draft_dir)
    logs = tmp_path / "logs" / "train" / key
    shutil.rmtree(logs)
    cmd = snakemake_cmd(tmp_path, tmp_path / "config.yaml", "train", "export")
    runner = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    last_log = logs / "segment-00002.log"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and runner.poll() is None:
        if last_log.exists() and "train segment 2" in last_log.read_text():
            break  # its progress bar is up: segment 2 is training
        time.sleep(0.02)
    os.killpg(runner.pid, signal.SIGKILL)
    runner.wait()
    assert not (draft_dir / "ckpt-00002.pt").exists(), "the kill should land during segment 2"
    assert not (draft_dir / ".staged" / "segment-00002.record.json").exists()
    finished = {name: stat(draft_dir / name) for name in ("ckpt-00000.pt", "ckpt-00001.pt")}
    first_logs = {p.name: p.read_text() for p in logs.glob("*.log")}

    snakemake(tmp_path, config, "--unlock")
    assert planned_jobs(snakemake(tmp_path, config, "train", "export", "-n")) == {
        "train_segment": 1,
        "train": 1,
        "export": 1,
    }
    snakemake(tmp_path, config, "train", "export")
    for name, before in finished.items():
        assert stat(draft_dir / name) == before  # not rewritten, not even touched
    for name in ("segment-00000.log", "segment-00001.log"):
        assert (logs / name).read_text() == first_logs[name]  # those jobs did not run again
    rerun = (logs / "segment-00002.log").read_text()
    assert "train segment 2" in rerun and "reusing" not in rerun  # trained again from checkpoint 1
    assert curve(draft_dir) == reference  # the same steps, losses and accuracies, bit for bit
    assert (draft_dir / "draft.safetensors").read_bytes() == reference_weights
    assert not list(draft_dir.glob(".tmp-*"))

    # A forced rerun of finished segments costs no training: Snakemake keeps the outputs
    # (they are update()-flagged) and each job finds its segment complete.
    staged = {name: stat(draft_dir / ".staged" / name)[0] for name in ("ckpt-00000.pt", "ckpt-00002.pt")}
    before = {i: (logs / f"segment-{i:05d}.log").read_text() for i in range(SEGMENTS)}
    snakemake(tmp_path, config, "train", "export", "--forcerun", "train_segment")
    for i in range(SEGMENTS):
        log = (logs / f"segment-{i:05d}.log").read_text()
        assert log == before[i] or "already built" in log  # not run, or run and found complete
    assert {name: stat(draft_dir / name)[0] for name in staged} == staged  # the same inodes
    assert curve(draft_dir) == reference
    assert (draft_dir / "draft.safetensors").read_bytes() == reference_weights
