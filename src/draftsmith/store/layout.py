"""The store's layout: where each artifact's files live and what they are called.

The one place for the store's file names (`MANIFEST`, `FILES` per stage, `RESULTS`, ...)
and the path helpers built on them (a key directory, a stage's declared outputs, the answer
store, a states store's shards, training segments). Keys come from `store.keys`; the plan
(`store.plan`) puts each artifact at its key with these names.
"""

from __future__ import annotations

import json
from pathlib import Path

from draftsmith.formats.shards.layout import SHARD_SUFFIXES
from draftsmith.fsutil.digests import sha256_bytes
from draftsmith.store.keys import STAGES, answers_key, is_key

MANIFEST = "manifest.json"
HASH_CACHE = ".hash-cache.json"
# Finished shards and training segments wait here (not a declared output) and are
# hard-linked into place: see `store.staging`.
STAGED = ".staged"
JOURNAL = "journal.jsonl"  # a responses artifact's resumable state before the answer store
# The answer store (`store.answers`): `<artifacts>/answers/<generation key>/answers.jsonl`,
# every answer generated under one model and generation settings, shared by all datasets.
ANSWERS = "answers"
ANSWERS_FILE = "answers.jsonl"
LOCKS = ".locks"  # one lock file per job that builds into the store (`store.lock`)

# One serving format's directory in an export (`sglang/`, `vllm/`): what a server loads,
# and the validation record written beside it.
EXPORT_FILES = {"config": "config.json", "weights": "model.safetensors", "record": "draftsmith_export.json"}

# Each stage's files by role (the role is the rule's output name and what code asks for).
FILES: dict[str, dict[str, str]] = {
    "model": {"info": "model.json", "hf": "hf"},
    "responses": {"responses": "responses.jsonl", "bad_rows": "bad_rows.jsonl"},
    "tokens": {"tokens": "tokens.jsonl"},
    "merged": {"train": "train.jsonl", "report": "data_report.json", "report_md": "data_report.md"},
    "hidden": {"assignment": "assignment.json"},
    "vocab": {"vocab": "vocab.safetensors", "info": "vocab.json"},
    "train": {"weights": "draft.safetensors", "config": "draft_config.json", "summary": "train_summary.json"},
    "export": {
        f"{fmt}_{role}": f"{fmt}/{name}" for fmt in ("sglang", "vllm") for role, name in EXPORT_FILES.items()
    },
    "evaluate": {"json": "benchmark.json", "md": "benchmark.md", "per_prompt": "per_prompt.jsonl"},
    "search": {"json": "search.json", "md": "search.md"},
    "serve_bench": {"json": "serve_benchmark.json", "md": "serve_benchmark.md"},
}
# In a states store (`hidden/<states key>/`), each shard's samples (address, input_ids,
# loss_mask), written when the shard is assigned and read by the job that extracts it.
SHARD_SAMPLES = "samples"

# Unkeyed files under results/<experiment>/: they describe this machine or this run.
RESULTS = {
    "estimate": "hidden_estimate.json",
    "estimate_md": "hidden_estimate.md",
    "summary": "benchmark.md",
    "html_report": "report.html",
}


def key_directory(relative: Path) -> Path | None:
    """The `<stage>/[<dataset>/]<key>` directory that a path relative to the store lies in,
    or None when it lies in none."""
    parts = relative.parts
    if not parts or parts[0] not in STAGES:
        return None
    depth = next((i for i in (1, 2) if len(parts) > i and is_key(parts[i])), None)
    return None if depth is None else Path(*parts[: depth + 1])


def declared(directory: Path | str, stage: str) -> dict[str, str]:
    """A stage's declared files in `directory` by role, the manifest last."""
    return {role: f"{directory}/{name}" for role, name in {**FILES[stage], "manifest": MANIFEST}.items()}


def output_patterns(root: Path | str, stage: str) -> dict[str, str]:
    """Declared files of a per-dataset stage with `{dataset}` and `{key}` wildcards."""
    return declared(f"{root}/{stage}/{{dataset}}/{{key}}", stage)


def answer_store(root: Path, model_key: str, generation: dict) -> Path:
    """The answer store directory of one model and generation settings (`keys.answers_key`)."""
    return Path(root) / ANSWERS / answers_key(model_key, generation)


def shard_name(addresses: list[str]) -> str:
    """A shard's name from its samples' addresses: two checkouts that assign the same
    missing samples name the shard alike."""
    return f"shard-{sha256_bytes(chr(10).join(sorted(addresses)).encode())[:16]}"


def shard_path(store: Path, name: str, part: str = "index") -> Path:
    return store / f"{name}{SHARD_SUFFIXES[part]}"


def shard_samples_path(store: Path, name: str) -> Path:
    return store / SHARD_SAMPLES / f"{name}.jsonl"


def stored_samples(store: Path) -> dict[str, str]:
    """Address -> shard name of every finished shard in a states store (its index is written last)."""
    found = {}
    for index in sorted(store.glob(f"shard-*{SHARD_SUFFIXES['index']}")):
        for row in json.loads(index.read_text(encoding="utf-8"))["samples"]:
            found[row[0]] = index.name.removesuffix(SHARD_SUFFIXES["index"])
    return found


def segment_name(index: int) -> str:
    return f"{index:05d}"
