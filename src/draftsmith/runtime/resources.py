"""What each rule's job holds: threads and GPUs, one function per rule that varies.

The rules read their `threads` and `gpu` resources from here, and the jobs acquire
the same number of GPUs (`gpus.acquire_gpus`), so the scheduler and the job agree.
"""

from __future__ import annotations

import os

TOKENS_WORKERS = 8
TOKENS_PARALLEL_BYTES = 1 << 20  # ~1,000 short records: below this one process is quicker
TRAIN_THREADS = 2  # CPU threads of a training segment job, shared by its ranks


def tokens_threads(responses: str) -> int:
    """Threads (worker processes) of a tokens job: a large dataset gets workers, a small one
    a single core and leaves the rest to other jobs. Decided by the responses file's size
    when the job starts; a dry run, before the file exists, shows 1."""
    try:
        large = os.path.getsize(responses) > TOKENS_PARALLEL_BYTES
    except OSError:
        return 1
    return TOKENS_WORKERS if large else 1


def responses_gpus(config: dict, backend: str) -> int:
    """GPUs a responses job holds: the local SGLang server's, one for hf generation on a
    GPU (two such jobs on one GPU run it out of memory at wide batches), none for an API."""
    if backend == "sglang":
        return config["generation"]["sglang"]["gpus"]
    if backend == "hf":
        return 1 if config["generation"]["hf"]["device"].startswith("cuda") else 0
    return 0


def hidden_gpus(config: dict) -> int:
    """GPUs one hidden-state shard job holds."""
    extract = config["extract"]
    if extract["backend"] == "sglang":
        return extract["sglang"]["gpus"]
    return 1 if extract["device"].startswith("cuda") else 0


def train_gpus(config: dict) -> int:
    """GPUs one training segment job holds."""
    train = config["train"]
    return train["gpus"] if train["device"] == "cuda" else 0


def train_tasks(config: dict) -> dict:
    """Slurm task layout of a training segment with W > 1 ranks: W tasks started by the
    job itself with `srun` (`runtime.slurm`), each with its share of the job's CPUs and,
    on GPUs, one GPU. Resource names are the Slurm executor plugin's; local runs ignore
    them. One rank needs none."""
    world = config["train"]["gpus"]
    if world == 1:
        return {}
    tasks = {"tasks": world, "mpi": "srun", "cpus_per_task": max(1, TRAIN_THREADS // world)}
    if train_gpus(config):
        tasks["tasks_per_gpu"] = 1
    return tasks


def evaluate_gpus(config: dict) -> int:
    return 1 if config["evaluate"]["device"] == "cuda" else 0


def serve_bench_gpus(config: dict) -> int:
    return config["serve_benchmark"]["sglang"]["tp_size"]
