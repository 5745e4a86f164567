"""Shard plan: which merged samples go to which shard, and the plan report.

The shard count is fixed by config so the whole DAG (every extraction job) is
known before any data exists; samples are spread over the shards by tokens
(longest first into the lightest shard), deterministically for the same merged
data and settings.
"""

from __future__ import annotations

import heapq
import shutil
from pathlib import Path

from draftsmith.errors import DraftsmithError

MODES = ("raw", "zstd", "fp8")


class DiskSpaceError(DraftsmithError):
    pass


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
    from draftsmith import atomic

    lengths = {s["id"]: len(s["input_ids"]) for s in atomic.read_jsonl(merged_path)}
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


def free_bytes(path: Path) -> int:
    path.mkdir(parents=True, exist_ok=True)
    return shutil.disk_usage(path).free


def report(plan: dict, hidden_size: int, dtype: str, extract_cfg: dict, out_root: Path) -> dict:
    from draftsmith.shards import bytes_per_token

    tokens = plan["num_tokens"]
    storage = {mode: round(tokens * bytes_per_token(hidden_size, dtype, mode)) for mode in MODES}
    rate = extract_cfg["throughput_tok_s"]
    return {
        "shards": plan["num_shards"],
        "samples": plan["num_samples"],
        "tokens": tokens,
        "tokens_per_shard": [s["num_tokens"] for s in plan["shards"]],
        "hidden_size": hidden_size,
        "dtype": dtype,
        "storage_mode": extract_cfg["storage"],
        "bytes_by_mode": storage,
        "bytes_needed": storage[extract_cfg["storage"]],
        "free_bytes": free_bytes(out_root),
        "throughput_tok_s": rate,
        "estimated_hours": round(tokens / rate / 3600, 3) if rate else None,
    }


def check_disk(needed: int, free: int, allow: bool, what: str) -> None:
    if needed > free and not allow:
        raise DiskSpaceError(
            f"{what} needs ~{needed / 1e9:.2f} GB but only {free / 1e9:.2f} GB are free; free space, "
            "pick a smaller storage mode (zstd, fp8), or set extract.allow_disk_overcommit: true"
        )


def markdown(rep: dict, experiment: str) -> str:
    gb = {mode: f"{b / 1e9:.3f} GB" for mode, b in rep["bytes_by_mode"].items()}
    hours = "n/a (set extract.throughput_tok_s)" if rep["estimated_hours"] is None else rep["estimated_hours"]
    rows = [
        ("shards", rep["shards"]),
        ("samples", f"{rep['samples']:,}"),
        ("tokens", f"{rep['tokens']:,}"),
        (
            "tokens per shard (min/max)",
            f"{min(rep['tokens_per_shard']):,} / {max(rep['tokens_per_shard']):,}",
        ),
        ("hidden size, dtype", f"{rep['hidden_size']}, {rep['dtype']}"),
        *((f"bytes on disk, {mode}", size) for mode, size in gb.items()),
        ("storage mode chosen", rep["storage_mode"]),
        ("free disk", f"{rep['free_bytes'] / 1e9:.2f} GB"),
        ("estimated hours", hours),
    ]
    body = "\n".join(f"| {k} | {v} |" for k, v in rows)
    return f"# Extraction plan: {experiment}\n\n| | |\n|---|---|\n{body}\n"
