"""Time `snakemake -n` on a production-sized plan: 10 datasets, thousands of shards.

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

REPO = Path(__file__).resolve().parents[1]


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
        for run in ("cold (hashing sources)", "warm (hash cache)"):
            started = time.perf_counter()
            subprocess.run(cmd, check=True, capture_output=True)
            rows.append((run, time.perf_counter() - started))
    jobs = 10 * 2 + 1 + 1 + 2 + args.shards + 1
    print(f"| dry run, {jobs} jobs ({args.shards} shards, 10 datasets) | seconds |\n|---|---|")
    for run, seconds in rows:
        print(f"| {run} | {seconds:.1f} |")


if __name__ == "__main__":
    main()
