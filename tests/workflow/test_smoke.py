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
