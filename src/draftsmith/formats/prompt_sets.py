"""Held-out prompt sets for the evaluator, and the check that none was trained on.

A set is read with the dataset reader (formats prompt, sharegpt, messages) and rendered
with the target's chat template exactly as the generation stage renders training
prompts, so the draft sees the same kind of context it was trained on. Any row that is
not a valid prompt is an error: an evaluation set drops nothing.

Overlap: a prompt's identity is its non-system turns, each normalised (Unicode NFKC,
casefolded, whitespace collapsed) and hashed. The system prompt is left out, so the
same question under another system prompt still counts as seen.

Length buckets: prompts by rendered prompt tokens under ascending upper bounds
(`evaluate.length_buckets`), as the evaluator's acceptance by length splits them and the
long-context set's builder (`promptgen.long_context`) fills them.
"""

from __future__ import annotations

import hashlib
import json
import unicodedata
from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

from draftsmith.errors import DraftsmithError
from draftsmith.formats.datasets.load import load_prompts
from draftsmith.fsutil import atomic

MAX_LISTED = 10


class OverlapError(DraftsmithError):
    """An evaluation prompt that also occurs among the training prompts."""


@dataclass(frozen=True)
class EvalPrompt:
    id: str
    line: int | None
    messages: list[dict[str, str]]
    input_ids: list[int]


def normalise(text: str) -> str:
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


def prompt_hash(messages: list[dict[str, str]]) -> str:
    turns = [[m["role"], normalise(m["content"])] for m in messages if m["role"] != "system"]
    return hashlib.sha256(json.dumps(turns, ensure_ascii=False).encode()).hexdigest()


def render(tokenizer, messages: list[dict[str, str]]) -> list[int]:
    """Prompt ids as the generation stage conditions the target on them."""
    return tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )


# --- length buckets -------------------------------------------------------------------


@dataclass(frozen=True)
class Bucket:
    """Prompts of min_tokens..max_tokens tokens (both inclusive; max None: no upper bound)."""

    label: str
    min_tokens: int
    max_tokens: int | None


def _tokens_text(count: int) -> str:
    return f"{count // 1024}k" if count % 1024 == 0 else str(count)


def buckets(bounds: list[int]) -> list[Bucket]:
    """The buckets of ascending upper bounds `bounds` (no bounds: one bucket of every prompt)."""
    if not bounds:
        return [Bucket("all", 0, None)]
    first, last = bounds[0], bounds[-1]
    middle = [
        Bucket(f"{_tokens_text(low)}-{_tokens_text(high)}", low, high - 1) for low, high in pairwise(bounds)
    ]
    head = Bucket(f"<{_tokens_text(first)}", 0, first - 1)
    return [head, *middle, Bucket(f">={_tokens_text(last)}", last, None)]


def bucket_of(prompt_tokens: int, bounds: list[int]) -> Bucket:
    return buckets(bounds)[bisect_right(bounds, prompt_tokens)]


def load_prompt_set(
    name: str, entry: dict, tokenizer, system_prompt: str | None, planned_sha256: str | None = None
) -> list[EvalPrompt]:
    """The first `max_prompts` prompts of one configured set (`evaluate.prompt_sets.<name>`);
    with `planned_sha256`, the file read must hash to it (`load_prompts`)."""
    loaded = load_prompts(
        name,
        {
            "path": entry["path"],
            "format": entry["format"],
            "prompt_field": entry["prompt_field"],
            "max_samples": entry["max_prompts"],
            "max_bad_fraction": 0.0,
            "generation": {"system_prompt": system_prompt},
        },
        planned_sha256=planned_sha256,
    )
    return [EvalPrompt(p.id, p.line, p.messages, render(tokenizer, p.messages)) for p in loaded.prompts]


def training_prompts(train_jsonl: str | Path, responses_files: Iterable[str | Path]) -> dict[str, str]:
    """Prompt hash -> id of a training sample with that prompt.

    The merged `train.jsonl` says which samples were trained on (ids only); their
    prompts live in each dataset's `responses.jsonl`.
    """
    files = [Path(p) for p in responses_files]
    wanted = {row["id"] for row in atomic.read_jsonl(train_jsonl)}
    hashes: dict[str, str] = {}
    found: set[str] = set()
    for path in files:
        for record in atomic.read_jsonl(path):
            if record["id"] in wanted:
                found.add(record["id"])
                hashes.setdefault(prompt_hash(record["messages"]), record["id"])
    missing = sorted(wanted - found)
    if missing:
        raise OverlapError(
            f"{train_jsonl}: {len(missing)} training sample(s) have no response record in "
            f"{[str(p) for p in files]} (first: {missing[:3]}); cannot check overlap"
        )
    return hashes


def check_overlap(prompt_sets: dict[str, list[EvalPrompt]], training: dict[str, str]) -> None:
    """Refuse any evaluation prompt whose normalised text is a training prompt."""
    clashes = [
        f"prompt set {name!r} row {p.id} (line {p.line}) is training sample {training[h]}"
        for name, prompts in prompt_sets.items()
        for p in prompts
        if (h := prompt_hash(p.messages)) in training
    ]
    if clashes:
        more = f"\n  ... and {len(clashes) - MAX_LISTED} more" if len(clashes) > MAX_LISTED else ""
        raise OverlapError(
            f"{len(clashes)} evaluation prompt(s) also occur among the training prompts "
            "(compared after NFKC, casefold and whitespace collapsing, system prompts aside):\n  "
            + "\n  ".join(clashes[:MAX_LISTED])
            + more
        )
