"""The fast subset's end-to-end run: every stage of the real workflow on the demo model, from
the GGUF to report.html, in one small config (the build the chaos suite also starts from)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import planned_jobs, snakemake

from draftsmith.store.verify import SHARD_INDEX_GLOB


def test_every_stage_runs_end_to_end_lossless_and_verified(built_pipeline):
    work, config = built_pipeline
    store = Path(config["artifacts_dir"])
    for stage in ("model", "responses", "tokens", "merged", "hidden", "vocab", "train", "export", "evaluate"):
        assert list((store / stage).glob("*/*")), f"nothing built under {stage}/"
    assert len(list(store.glob(f"hidden/*/{SHARD_INDEX_GLOB}"))) >= 2  # shard jobs, not one
    benchmark = json.loads(next(store.glob("evaluate/*/benchmark.json")).read_text())
    assert benchmark["lossless"] is True
    experiment = work / "results" / config["experiment"]
    assert (experiment / "benchmark.md").exists() and (experiment / "report.html").stat().st_size > 0
    verify = [sys.executable, "-m", "draftsmith", "verify", "--configfile", str(work / "config.yaml")]
    assert subprocess.run(verify, capture_output=True, text=True, cwd=work).returncode == 0
    assert planned_jobs(snakemake(work, config, "-n", name="again.yaml")) == {}


def test_stage_times_tables_every_rule_of_the_run(built_pipeline):
    """bench/stage_times.py, which the device runs report with, reads the run's benchmarks."""
    work, _ = built_pipeline
    script = Path(__file__).resolve().parents[2] / "bench" / "stage_times.py"
    done = subprocess.run(
        [sys.executable, str(script), "--configfile", "config.yaml"], capture_output=True, text=True, cwd=work
    )
    assert done.returncode == 0, done.stderr
    rows = {line.split(" | ")[0].strip("| "): line for line in done.stdout.splitlines()[2:]}
    assert {"model", "responses", "tokens", "hidden_shard", "train", "evaluate"} <= set(rows)
    assert rows["hidden_shard"].split(" | ")[1] == "2" and int(rows["train"].split(" | ")[1]) > 2  # segments
