"""The hidden-state estimate: the extraction a mix still needs (tokens to forward through
the target and bytes to write, for the samples the states store lacks), hours and free
disk, written before any extraction runs, and the disk check every extraction job repeats."""

from __future__ import annotations

import shutil
from pathlib import Path

from draftsmith.errors import DraftsmithError
from draftsmith.formats.markdown import human_size

MODES = ("raw", "zstd", "fp8")


class DiskSpaceError(DraftsmithError):
    pass


def free_bytes(path: Path) -> int:
    path.mkdir(parents=True, exist_ok=True)
    return shutil.disk_usage(path).free


def estimate(
    assignment: dict,
    hidden_size: int,
    dtype: str,
    out_root: Path,
    *,
    storage_mode: str,
    throughput_tok_s: float | None,
) -> dict:
    """`throughput_tok_s`: the measured extraction speed, for the hours (None: no estimate)."""
    from draftsmith.formats.shards.codec import bytes_per_token

    tokens = assignment["extract_tokens"]
    storage = {mode: round(tokens * bytes_per_token(hidden_size, dtype, mode)) for mode in MODES}
    rate = throughput_tok_s
    return {
        "samples": assignment["num_samples"],
        "mix_tokens": assignment["num_tokens"],
        "stored_samples": assignment["stored_samples"],
        "shards_to_extract": len(assignment["to_extract"]),
        "tokens": tokens,
        "hidden_size": hidden_size,
        "dtype": dtype,
        "storage_mode": storage_mode,
        "bytes_by_mode": storage,
        "bytes_needed": storage[storage_mode],
        "free_bytes": free_bytes(out_root),
        "throughput_tok_s": rate,
        "estimated_hours": round(tokens / rate / 3600, 3) if rate else None,
    }


def check_disk(needed: int, free: int, allow: bool, what: str) -> None:
    if needed > free and not allow:
        raise DiskSpaceError(
            f"{what} needs ~{human_size(needed)} ({needed:,} bytes) but only {human_size(free)} "
            f"({free:,} bytes) are free; free space, "
            "pick a smaller storage mode (zstd, fp8), or set extract.allow_disk_overcommit: true"
        )


def markdown(rep: dict, experiment: str) -> str:
    gb = {mode: f"{b / 1e9:.3f} GB" for mode, b in rep["bytes_by_mode"].items()}
    hours = "n/a (set extract.throughput_tok_s)" if rep["estimated_hours"] is None else rep["estimated_hours"]
    rows = [
        ("samples in the mix (tokens)", f"{rep['samples']:,} ({rep['mix_tokens']:,})"),
        ("distinct samples already stored", f"{rep['stored_samples']:,}"),
        ("shards to extract", rep["shards_to_extract"]),
        ("tokens to forward", f"{rep['tokens']:,}"),
        ("hidden size, dtype", f"{rep['hidden_size']}, {rep['dtype']}"),
        *((f"bytes to write, {mode}", size) for mode, size in gb.items()),
        ("storage mode chosen", rep["storage_mode"]),
        ("free disk", human_size(rep["free_bytes"])),
        ("estimated hours", hours),
    ]
    body = "\n".join(f"| {k} | {v} |" for k, v in rows)
    return f"# Hidden-state estimate: {experiment}\n\n| | |\n|---|---|\n{body}\n"
