"""End-to-end runs of the real workflow on the demo model: staleness, sharing, verify."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import planned_jobs, snakemake, workflow_config, write_rows

from draftsmith.store.layout import ANSWERS, ANSWERS_FILE, LOCKS

pytestmark = pytest.mark.slow

ALPHA = ["Name a primary colour.", "What is 2 + 2?", "Say hi.", "Name a fruit."]
BETA = ["Write a Python comment.", "What does ls do?", "Name a planet."]
GAMMA = ["What is the capital of France?", "Count to three."]


@pytest.fixture(scope="module")
def built(tmp_path_factory, demo_model_dir):
    """One finished `merged` run with datasets alpha and beta."""
    work = tmp_path_factory.mktemp("wf")
    sources = {
        "alpha": write_rows(work / "alpha.jsonl", ALPHA),
        "beta": write_rows(work / "beta.jsonl", BETA),
    }
    config = workflow_config(work, demo_model_dir, sources)
    snakemake(work, config, "merged")
    return work, config


def artifact_files(root: Path) -> dict[str, tuple[int, int]]:
    """Every artifact file with (inode, mtime_ns): proves files were not rewritten."""
    return {
        str(p.relative_to(root)): (p.stat().st_ino, p.stat().st_mtime_ns)
        for p in root.rglob("*")
        if p.is_file() and ".hash-cache" not in p.name
    }


def test_data_outputs_and_report(built):
    work, _ = built
    merged = next((work / "artifacts" / "merged").iterdir())
    report = json.loads((merged / "data_report.json").read_text())
    assert [r["dataset"] for r in report["datasets"]] == ["alpha", "beta"]
    assert report["total"]["merged"] == len(ALPHA) + len(BETA)
    samples = [json.loads(line) for line in (merged / "train.jsonl").read_text().splitlines()]
    assert {s["id"] for s in samples} == {f"alpha-{i:06d}" for i in range(4)} | {
        f"beta-{i:06d}" for i in range(3)
    }
    for sample in samples:
        assert len(sample["input_ids"]) == len(sample["loss_mask"]) and sum(sample["loss_mask"]) > 0
    log = next((work / "logs" / "responses" / "alpha").glob("*.log")).read_text()
    assert "generate alpha" in log and "tok/s" in log  # progress bar in the rule log


def test_second_run_does_nothing(built):
    work, config = built
    assert planned_jobs(snakemake(work, config, "merged", "-n")) == {}


def test_seed_change_reruns_merge_only(built):
    work, config = built
    changed = dict(config, merge={"seed": 1})
    assert planned_jobs(snakemake(work, changed, "merged", "-n", name="seed1.yaml")) == {"merged": 1}


def test_adding_dataset_generates_only_it(built):
    work, config = built
    before = artifact_files(work / "artifacts")
    datasets = dict(
        config["datasets"], gamma={"path": str(write_rows(work / "gamma.jsonl", GAMMA)), "format": "prompt"}
    )
    added = dict(config, datasets=datasets)
    plan = planned_jobs(snakemake(work, added, "merged", "-n", name="added.yaml"))
    assert plan == {"responses": 1, "tokens": 1, "merged": 1}
    (store,) = list((work / "artifacts" / ANSWERS).glob(f"*/{ANSWERS_FILE}"))
    stored = store.read_bytes()
    snakemake(work, added, "merged", name="added.yaml")
    after = artifact_files(work / "artifacts")
    # Nothing rewritten but the answer store (and its lock), which gains gamma's answers only.
    shared = {str(store.relative_to(work / "artifacts")), f"{LOCKS}/{ANSWERS}/{store.parent.name}.lock"}
    assert {k: v for k, v in after.items() if k in before and k not in shared} == {
        k: v for k, v in before.items() if k not in shared
    }
    assert store.read_bytes().startswith(stored)
    added_lines = store.read_bytes()[len(stored) :].decode().splitlines()
    assert sorted(json.loads(line)["messages"][-1]["content"] for line in added_lines) == sorted(GAMMA)
    new = sorted(
        {k.split("/")[1] for k in after if k not in before and k.startswith(("responses", "tokens"))}
    )
    assert new == ["gamma"]


def test_configs_share_upstream_and_differ_side_by_side(built):
    work, config = built
    other = dict(config, merge={"seed": 7}, experiment="other")
    snakemake(work, other, "merged", name="other.yaml")
    root = work / "artifacts"
    assert len(list((root / "responses" / "alpha").iterdir())) == 1  # shared
    assert len(list((root / "tokens" / "alpha").iterdir())) == 1
    merged = sorted(p.name for p in (root / "merged").iterdir())
    assert len(merged) >= 2  # seed 0 and seed 7 side by side


def test_verify_names_corruption_and_rerun_rebuilds_it(built):
    work, config = built
    root = work / "artifacts"
    tokens = next((root / "tokens" / "beta").iterdir()) / "tokens.jsonl"
    data = bytearray(tokens.read_bytes())
    data[10] ^= 0x01
    tokens.write_bytes(bytes(data))
    verify = [sys.executable, "-m", "draftsmith", "verify", str(root)]
    result = subprocess.run(verify, capture_output=True, text=True)
    assert result.returncode == 1 and f"CORRUPT {tokens.parent / 'manifest.json'}" in result.stdout
    assert "sha256 mismatch" in result.stdout
    fixed = subprocess.run([*verify, "--fix"], capture_output=True, text=True)
    assert "quarantined" in fixed.stdout and not tokens.exists()
    targets = fixed.stdout.split("snakemake ", 1)[1].split()
    assert targets == [str(tokens.parent / "manifest.json")]
    assert planned_jobs(snakemake(work, config, *targets, "-n")) == {"tokens": 1}
    snakemake(work, config, *targets)
    assert subprocess.run(verify, capture_output=True, text=True).returncode == 0
    assert planned_jobs(snakemake(work, config, "merged", "-n")) == {}  # nothing downstream reruns


def test_dry_run_with_model_absent_shows_plan(tmp_path):
    config = workflow_config(
        tmp_path, tmp_path / "no-such-model", {"alpha": write_rows(tmp_path / "a.jsonl", ALPHA)}
    )
    result = snakemake(tmp_path, config, "merged", "-n")
    assert planned_jobs(result) == {"model": 1, "responses": 1, "tokens": 1, "merged": 1}
    assert "source not found" in result.stderr + result.stdout
