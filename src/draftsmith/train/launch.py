"""One training segment's processes: this one, a torchrun group, or srun tasks.

`launch` runs a segment in this process (world size 1) or starts a group of
`train.gpus` ranks: srun tasks inside a Slurm allocation (`runtime.slurm`), else
torchrun. Each rank runs `main` (`python -m draftsmith.train.launch JOB.json
[--slurm]`): it reads its rank from the environment, joins the process group (NCCL on
GPU, gloo on CPU), trains the segment (`loop.run_segment`) and leaves the group.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import sys
from pathlib import Path

import torch

from draftsmith.fsutil import atomic
from draftsmith.runtime import jobs, slurm
from draftsmith.train.loop import run_segment
from draftsmith.train.process_group import Dist, process_group_backend
from draftsmith.train.settings import TrainSpec
from draftsmith.train.state import TrainError


def write_rank_job(
    spec: TrainSpec, segment: int, previous: str | Path | None, checkpoint: str | Path, metrics: str | Path
) -> Path:
    """The file each rank of a group reads its segment from (a temp beside the checkpoint,
    which the launcher removes)."""
    job = {
        "spec": spec.as_json(),
        "segment": segment,
        "previous": str(previous) if previous else None,
        "checkpoint": str(checkpoint),
        "metrics": str(metrics),
    }
    job_file = Path(checkpoint).parent / atomic.temp_name(f"segment-{segment:05d}.json")
    atomic.write_json(job_file, job)
    return job_file


def launch(
    spec: TrainSpec,
    segment: int,
    previous: str | Path | None,
    checkpoint: str | Path,
    metrics: str | Path,
    *,
    world_size: int,
    threads: int = 1,
    torchrun: bool | None = None,
) -> None:
    """Run one segment in this process (world size 1) or in a group of `world_size`
    processes: srun tasks inside a Slurm allocation (`runtime.slurm`), else torchrun
    (`torchrun` True forces a torchrun group of one, as on a node with one GPU)."""
    if not (world_size > 1 if torchrun is None else torchrun):
        run_segment(spec, segment, previous, checkpoint, metrics)
        return
    from draftsmith.runtime.process import run_guarded

    job_file = write_rank_job(spec, segment, previous, checkpoint, metrics)
    rank_threads = max(1, threads // world_size)
    env = {"OMP_NUM_THREADS": str(rank_threads), "PYTHONUNBUFFERED": "1"}
    rank = [sys.executable, "-m", "draftsmith.train.launch", str(job_file)]
    launcher = "srun" if slurm.in_allocation() and torchrun is None else "torchrun"
    if launcher == "srun":
        cuda = spec.train.device == "cuda"
        cmd = slurm.srun_command(world_size, rank_threads, int(cuda), [*rank, "--slurm"])
        env |= slurm.rendezvous_env()
    else:
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nnodes",
            "1",
            "--nproc-per-node",
            str(world_size),
            *rank[1:],
        ]
    try:
        code = run_guarded(cmd, env=env, name=f"{launcher} segment {segment}")
    finally:
        job_file.unlink(missing_ok=True)
    if code != 0:
        raise TrainError(f"{launcher} for segment {segment} exited with code {code}: {shlex.join(cmd)}")


def main(argv: list[str] | None = None) -> int:
    """Entry point of one rank: `python -m draftsmith.train.launch JOB.json [--slurm]` (a
    torchrun process, or with `--slurm` an srun task)."""
    parser = argparse.ArgumentParser(prog="python -m draftsmith.train.launch")
    parser.add_argument("job", type=Path)
    parser.add_argument("--slurm", action="store_true", help="take the rank from srun's task variables")
    args = parser.parse_args(argv)
    job = json.loads(args.job.read_text())
    spec = TrainSpec.from_json(job["spec"])
    if args.slurm:
        os.environ.update(slurm.rank_env(dict(os.environ)))
    dist_env = Dist.from_env()
    logging.basicConfig(
        level=logging.INFO if dist_env.main else logging.WARNING,
        format=f"%(asctime)s %(levelname)s rank{dist_env.rank} %(name)s: %(message)s",
        stream=sys.stderr,
    )
    jobs.set_parent_death_signal()
    import torch.distributed as dist

    device = spec.train.device
    if device == "cuda":
        # torchrun shows a rank every GPU; srun with --gpus-per-task shows it its own.
        torch.cuda.set_device(dist_env.local_rank % torch.cuda.device_count())
    dist.init_process_group(process_group_backend(device))
    try:
        run_segment(spec, job["segment"], job["previous"], job["checkpoint"], job["metrics"], dist_env)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
