"""The shard assignment: which merged samples go to which hidden-state shard.

The shard count is fixed by config so the whole DAG (every extraction job) is
known before any data exists; samples are spread over the shards by tokens
(longest first into the lightest shard), deterministically for the same merged
data and settings.
"""

from __future__ import annotations

import heapq
from pathlib import Path

from draftsmith.errors import ConfigError
from draftsmith.store import atomic


def assign(samples: list[tuple[str, int]], num_shards: int) -> list[list[str]]:
    """Balance (sample id, token count) pairs over `num_shards` shards by tokens."""
    shards: list[list[str]] = [[] for _ in range(num_shards)]
    heap = [(0, index) for index in range(num_shards)]
    for sample_id, tokens in sorted(samples, key=lambda s: (-s[1], s[0])):
        load, index = heapq.heappop(heap)
        shards[index].append(sample_id)
        heapq.heappush(heap, (load + tokens, index))
    return shards


def build(merged_path: Path, num_shards: int, shard_names: list[str]) -> dict:
    lengths = {s["id"]: len(s["input_ids"]) for s in atomic.read_jsonl(merged_path)}
    if len(lengths) < num_shards:
        raise ConfigError(
            f"extract.num_shards: {num_shards} shards for {len(lengths)} samples in {merged_path} "
            "would leave shards empty; set num_shards to at most the sample count"
        )
    groups = assign(list(lengths.items()), num_shards)
    return {
        "num_shards": num_shards,
        "num_samples": len(lengths),
        "num_tokens": sum(lengths.values()),
        "shards": [
            {"name": name, "samples": ids, "num_tokens": sum(lengths[i] for i in ids)}
            for name, ids in zip(shard_names, groups, strict=True)
        ],
    }
