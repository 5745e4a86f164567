"""Process groups inside a Slurm allocation: one task per rank, started by `srun`.

A training segment with `train.gpus` W > 1 submitted through the Slurm profile gets W
tasks in its allocation (`runtime.resources.train_tasks`: the executor plugin's `tasks`
and `mpi` resources, so the job's own snakemake runs in the batch step and leaves the
tasks free). The segment then starts its ranks with `srun`, one task per GPU (or per
CPU rank), instead of torchrun. Each rank maps Slurm's task variables to the ones
`torch.distributed` reads (`rank_env`); the launching host is rank 0's, so it is the
rendezvous address (`srun` puts task 0 on the allocation's first node, where the batch
step runs).
"""

from __future__ import annotations

import os
import shutil
import socket

# What srun tells each task, and what torch.distributed's env:// rendezvous reads.
_TASK_VARS = {"SLURM_PROCID": "RANK", "SLURM_NTASKS": "WORLD_SIZE", "SLURM_LOCALID": "LOCAL_RANK"}


def in_allocation() -> bool:
    """Whether this process runs inside a Slurm job that `srun` can start steps in."""
    return "SLURM_JOB_ID" in os.environ and shutil.which("srun") is not None


def free_port() -> int:
    """A TCP port nobody listens on now, for the group's rendezvous."""
    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def srun_command(world_size: int, threads_per_rank: int, gpus_per_rank: int, command: list[str]) -> list[str]:
    """`command` as `world_size` tasks of one step; any task failing stops them all."""
    cmd = [
        "srun",
        f"--ntasks={world_size}",
        f"--cpus-per-task={threads_per_rank}",
        "--kill-on-bad-exit=1",
        "--export=ALL",
    ]
    if gpus_per_rank:
        cmd.append(f"--gpus-per-task={gpus_per_rank}")
    return [*cmd, *command]


def rendezvous_env() -> dict[str, str]:
    """What the launcher passes to every task: rank 0's address and a free port."""
    return {"MASTER_ADDR": socket.gethostname(), "MASTER_PORT": str(free_port())}


def rank_env(environ: dict[str, str]) -> dict[str, str]:
    """torch.distributed's rank variables from Slurm's task variables (a KeyError names
    the one missing: the process was not started by srun)."""
    return {torch_var: environ[slurm_var] for slurm_var, torch_var in _TASK_VARS.items()}
