"""Several GPUs of one host: data-parallel training and extraction, one GPU against N.

Training: the same synthetic data (bench/train_throughput.py's target shapes) trained for
`--steps` steps as one process and as N (one per GPU, NCCL; gloo with `--device cpu`),
through the launcher the `train` rule uses. The global batch is fixed, so both see the
same batches in the same order and their loss curves must agree within float noise.
Prints step time, tokens/s, the speed-up and the largest relative loss difference.

Extraction (`--extract-config`): the workflow's own `hidden` target of that config, its
shard jobs forced to rerun, once with `--resources gpu=1` and once with `gpu=N` (N shard
jobs at once, each on the GPU its lock took). Prints the wall times, the speed-up, and how
many shard jobs ran against how many shards the plan has (each must run exactly once).

Serving (`--serve-config`): `snakemake serve_bench` of a config whose
`serve_benchmark.sglang.tp_size` is N, forced to rerun: starts and tears down the
tensor-parallel SGLang servers (needs SGLang there).

    python bench/multi_gpu.py --gpus 2 --shape demo --steps 40 \\
        --extract-config configs/smollm2-medium-h200.yaml
    # the CPU check of the same code (the GPU-sized defaults grow a CPU rank past 11 GiB):
    python bench/multi_gpu.py --gpus 2 --device cpu --steps 6 --samples 16 --length 256 \\
        --batch-tokens 2048 --draft-vocab 2048 --ttt 3
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from train_throughput import SHAPES, synthetic_spec

from draftsmith.train.launch import launch

WARM_STEPS = 2  # first steps include allocator growth and kernel selection


def train_records(spec: dict, work: Path, world: int) -> list[dict]:
    spec = json.loads(json.dumps(spec))
    spec["train"]["gpus"] = world
    metrics = work / f"metrics-{world}.jsonl"
    launch(spec, 0, None, work / f"ckpt-{world}.pt", metrics, world_size=world, torchrun=world > 1)
    lines = metrics.read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == "train"]


def training_rows(one: list[dict], many: list[dict], world: int) -> list[tuple[str, str]]:
    def rate(records: list[dict]) -> tuple[float, float]:
        warm = records[WARM_STEPS:]
        seconds = sum(r["time_s"] for r in warm)
        return seconds / len(warm), sum(r["tokens"] for r in warm) / seconds

    (step_one, rate_one), (step_many, rate_many) = rate(one), rate(many)
    worst = max(abs(a["loss"] - b["loss"]) / abs(a["loss"]) for a, b in zip(one, many, strict=True))
    same_batches = [r["tokens"] for r in one] == [r["tokens"] for r in many]
    return [
        ("training: steps (first 2 not timed)", str(len(one))),
        ("training: same tokens every step", "yes" if same_batches else "NO"),
        ("training: step time 1 / N (s)", f"{step_one:.3f} / {step_many:.3f}"),
        ("training: tokens/s 1 / N", f"{rate_one:,.0f} / {rate_many:,.0f}"),
        (f"training: speed-up on {world}", f"{rate_many / rate_one:.2f}x"),
        ("training: worst relative loss difference", f"{worst:.2e}"),
    ]


def snakemake(config: str, target: str, gpus: int, log: Path) -> float:
    """Wall seconds of `snakemake <target>` with its `target` jobs forced to rerun."""
    forced = "hidden_shard" if target == "hidden" else target
    command = [sys.executable, "-m", "snakemake", target, "--forcerun", forced, "--configfile", config]
    command += ["--cores", "all", "--resources", f"gpu={gpus}"]
    started = time.perf_counter()
    with log.open("w") as out:
        subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, check=True)
    return time.perf_counter() - started


def extraction_rows(config: str, world: int, work: Path) -> list[tuple[str, str]]:
    times, runs = {}, {}
    for gpus in (1, world):
        log = work / f"hidden-gpu{gpus}.log"
        times[gpus] = snakemake(config, "hidden", gpus, log)
        runs[gpus] = len(re.findall(r"^(?:local)?rule hidden_shard:", log.read_text(), re.MULTILINE))
    return [
        ("extraction: wall 1 / N GPUs (s)", f"{times[1]:.1f} / {times[world]:.1f}"),
        (f"extraction: speed-up on {world}", f"{times[1] / times[world]:.2f}x"),
        ("extraction: shard jobs run (1 / N GPUs)", f"{runs[1]} / {runs[world]}"),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=2, help="N: processes (GPUs) to compare with one")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="demo")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--samples", type=int, default=256)
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--batch-tokens", type=int, default=32768)
    parser.add_argument("--draft-vocab", type=int, default=16384)
    parser.add_argument("--ttt", type=int, default=5)
    parser.add_argument("--extract-config", help="a config whose `hidden` target to time on 1 and N GPUs")
    parser.add_argument("--serve-config", help="a config whose serve_bench runs SGLang with tp_size N")
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    work = args.dir or Path(tempfile.mkdtemp(prefix="multi-gpu-"))
    spec = synthetic_spec(work, args, "bfloat16" if args.device == "cuda" else None, args.steps)
    rows = training_rows(train_records(spec, work, 1), train_records(spec, work, args.gpus), args.gpus)
    if args.extract_config:
        rows += extraction_rows(args.extract_config, args.gpus, work)
    if args.serve_config:
        seconds = snakemake(args.serve_config, "serve_bench", args.gpus, work / "serve_bench.log")
        rows.append(("serving: serve_bench wall (s)", f"{seconds:.1f}"))
    width = max(len(key) for key, _ in rows)
    print(f"| {'what'.ljust(width)} | value |\n|{'-' * (width + 2)}|-------|")
    for key, value in rows:
        print(f"| {key.ljust(width)} | {value} |")
    print(f"\nlogs and metrics in {work}")


if __name__ == "__main__":
    main()
