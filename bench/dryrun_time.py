"""Time `snakemake -n` on a production-sized plan: 10 datasets, thousands of shards.

Before the data exists the shard jobs are unknown (`hidden_assign` is a checkpoint), so
the dry run is timed twice more with the checkpoint's output in place: a view naming
`--shards` new shards, each with its (empty) samples file, so that Snakemake plans one
`hidden_shard` job per shard.

Usage: python bench/dryrun_time.py [--shards 3000]; prints one table.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from draftsmith.workflow import configure

REPO = Path(__file__).resolve().parents[1]
SAMPLES = 40_114


def config(work: Path, shards: int) -> dict:
    datasets = {}
    for i in range(10):
        path = work / f"d{i}.jsonl"
        # Enough rows for one sample per shard at least (the plan refuses emptier shards).
        rows = max(100, -(-shards // 10))
        path.write_text("".join(json.dumps({"prompt": f"p{i}-{j}"}) + "\n" for j in range(rows)))
        datasets[f"d{i}"] = {"path": str(path), "format": "prompt"}
    return {
        "experiment": "dryrun",
        "artifacts_dir": str(work / "artifacts"),
        "model": {"source": {"kind": "hf_dir", "path": str(work / "absent-model")}},
        "datasets": datasets,
        "extract": {"num_shards": shards},
        "evaluate": {"enabled": False},
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shards", type=int, default=3000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "config.yaml").write_text(yaml.safe_dump(config(work, args.shards)))
        cmd = [
            sys.executable,
            "-m",
            "snakemake",
            "-s",
            str(REPO / "Snakefile"),
            "-d",
            tmp,
            "-n",
            "--configfile",
            str(work / "config.yaml"),
            "--quiet",
            "rules",
        ]
        rows = []
        for run in ("cold (hashing sources)", "warm (hash cache)", "assigned, warm"):
            if run == "assigned, warm":
                assigned(config(work, args.shards), args.shards)
            started = time.perf_counter()
            out = subprocess.run(cmd, check=True, capture_output=True, text=True)
            rows.append((run, time.perf_counter() - started, shard_jobs(out.stdout + out.stderr)))
    print(f"| dry run ({args.shards} shards, 10 datasets) | seconds | hidden_shard jobs planned |")
    print("|---|---|---|")
    for run, seconds, planned in rows:
        print(f"| {run} | {seconds:.1f} | {planned} |")


def shard_jobs(output: str) -> int:
    """The `hidden_shard` row of the dry run's job stats (0 when it plans none)."""
    rows = [line.split() for line in output.split("Job stats:", 1)[-1].splitlines()]
    return next((int(row[1]) for row in rows if len(row) == 2 and row[0] == "hidden_shard"), 0)


def assigned(raw: dict, shards: int) -> None:
    """What the data stages and `hidden_assign` leave when it assigns `shards` new shards:
    their outputs (empty files), the view and each shard's samples file."""
    plan = configure(raw)
    for artifact in [plan.model, *plan.responses.values(), *plan.tokens.values(), plan.merged]:
        for path in map(Path, artifact.outputs.values()):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.mkdir() if path.name == "hf" else path.touch()
    names = [f"shard-{i:016x}" for i in range(shards)]
    plan.hidden.directory.mkdir(parents=True)
    # As many samples as the production run this project was born from, over the shards.
    samples = [[f"d{i % 10}-{i:06d}", f"{i:064x}", names[i % shards]] for i in range(SAMPLES)]
    plan.hidden.path("assignment").write_text(json.dumps({"shards": names, "samples": samples}))
    plan.hidden.manifest.write_text("{}")
    for name in names:
        plan.shard_samples(name).parent.mkdir(parents=True, exist_ok=True)
        plan.shard_samples(name).touch()


if __name__ == "__main__":
    main()
