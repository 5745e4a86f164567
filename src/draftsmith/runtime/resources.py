"""What each rule's job holds: threads and GPUs, one function per rule that varies.

The rules read their `threads` and `gpu` resources from here, and the jobs acquire
the same number of GPUs (`gpus.acquire_gpus`), so the scheduler and the job agree.
"""

from __future__ import annotations

import os

TOKENS_WORKERS = 8
TOKENS_PARALLEL_BYTES = 1 << 20  # ~1,000 short records: below this one process is quicker


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
    """GPUs a responses job holds: the local SGLang server's, else none (hf generation on
    a GPU shares it through `generation.hf.device`)."""
    return config["generation"]["sglang"]["gpus"] if backend == "sglang" else 0


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


def evaluate_gpus(config: dict) -> int:
    return 1 if config["evaluate"]["device"] == "cuda" else 0


def serve_bench_gpus(config: dict) -> int:
    return config["serve_benchmark"]["sglang"]["tp_size"]
