"""The shard's files and index: their names, the format version, the modes, the blob
order and the index's text (see the package docstring). No torch: the artifact plan
imports it."""

from __future__ import annotations

import json
from collections.abc import Sequence

from draftsmith.errors import DraftsmithError

SHARD_FORMAT_VERSION = 1
MODES = ("raw", "zstd", "fp8")
ALIGNMENT = 64
SHARD_SUFFIXES = {"bin": ".bin", "index": ".json"}  # one hidden-state shard's two files
_BASE_BLOBS = ("input_ids", "loss_mask", "aux", "final")
_FP8_BLOBS = ("aux_scale", "final_scale")


class ShardError(DraftsmithError):
    pass


def blob_names(mode: str) -> tuple[str, ...]:
    return _BASE_BLOBS + _FP8_BLOBS if mode == "fp8" else _BASE_BLOBS


def _check_choice(what: str, value: str, choices: Sequence[str]) -> None:
    if value not in choices:
        raise ShardError(f"unknown shard {what} {value!r}; expected one of {', '.join(choices)}")


def manifest_text(manifest: dict) -> str:
    """Indented JSON with one compact line per sample row (readable and small)."""
    head = {k: v for k, v in manifest.items() if k != "samples"}
    text = json.dumps(head, indent=2, sort_keys=True, ensure_ascii=False)
    lines = [json.dumps(row, separators=(",", ":"), ensure_ascii=False) for row in manifest["samples"]]
    rows = ",\n    ".join(lines)
    samples = f"[\n    {rows}\n  ]" if rows else "[]"
    return f'{text[:-2]},\n  "samples": {samples}\n}}\n'
