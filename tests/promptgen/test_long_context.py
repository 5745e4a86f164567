"""The long-context prompt set: held-out Python source at lengths spread over the buckets,
with provenance, never a training text; and the shipped file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import write_training

from draftsmith.formats.prompt_sets import bucket_of, check_overlap, load_prompt_set, render, training_prompts
from draftsmith.promptgen import long_context as lp
from draftsmith.promptgen.docstrings import held_out, normalised
from draftsmith.target import load as target

REPO = Path(__file__).resolve().parents[2]
PROVENANCE = {"id", "prompt", "task", "package", "version", "module", "path", "lines", "prompt_tokens"}


@pytest.fixture(scope="module")
def tokenizer(demo_model_dir):
    return target.load_tokenizer(demo_model_dir)


def _tokens(tokenizer, text: str) -> int:
    return len(render(tokenizer, [{"role": "user", "content": text}]))


def _source_lines(row: dict) -> list[str]:
    """The lines of the row's file that it quotes, read from the file itself."""
    root = Path(lp.source_roots([], stdlib=True)[0][1])
    first, last = row["lines"]
    return (root / row["path"]).read_text().splitlines()[first - 1 : last]


def test_length_slots_split_each_bucket_within_the_token_limits():
    slots = lp.length_slots([64, 256], per_bucket=2, min_tokens=40, max_tokens=600)
    assert slots == [(40, 51), (52, 63), (64, 159), (160, 255), (256, 427), (428, 600)]


def test_builder_fills_the_requested_ranges_with_provenance_and_no_training_text(tmp_path, tokenizer):
    out = tmp_path / "long.jsonl"
    info = lp.build(out, tokenizer, [256, 1024], per_bucket=2, min_tokens=96, max_tokens=1800)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert info["prompts"] == len(rows) == 6
    slots = lp.length_slots([256, 1024], 2, 96, 1800)
    assert sorted(r["prompt_tokens"] for r in rows) == info["tokens"]
    for row, (lowest, highest) in zip(rows, sorted(slots), strict=True):
        assert set(row) == PROVENANCE and row["package"] == "stdlib" and row["task"] in lp.TASKS
        assert lowest <= row["prompt_tokens"] == _tokens(tokenizer, row["prompt"]) <= highest
        assert held_out(row["module"])  # docstrings' held-out modules only
        quoted = _source_lines(row)
        assert (
            "\n".join(quoted) in row["prompt"]
            and row["id"] == f"{row['module']}:{row['lines'][0]}-{row['lines'][1]}"
        )
    labels = [bucket_of(r["prompt_tokens"], [256, 1024]).label for r in rows]
    assert labels == ["<256", "<256", "256-1k", "256-1k", ">=1k", ">=1k"]

    # A training set that quotes a line of the first row's file: that file is not used again.
    first = rows[0]
    line = next(text for text in _source_lines(first) if len(normalised(text)) >= lp.MIN_SHARED_LINE)
    train, responses = write_training(tmp_path, {"chat-000000": f"What does this do?\n{line.strip()}"})
    again = tmp_path / "again.jsonl"
    lp.build(again, tokenizer, [256, 1024], per_bucket=2, min_tokens=96, max_tokens=1800, exclude=[responses])
    entry = {"path": str(again), "format": "prompt", "prompt_field": "prompt", "max_prompts": None}
    rebuilt = load_prompt_set("long", entry, tokenizer, None)
    assert len(rebuilt) == 6
    assert first["path"] not in {json.loads(line)["path"] for line in again.read_text().splitlines()}
    check_overlap({"long": rebuilt}, training_prompts(train, [responses]))


def test_too_little_held_out_source_is_an_error(tmp_path, tokenizer):
    with pytest.raises(lp.PromptSourceError, match="no held-out source file left for a prompt of"):
        lp.build(
            tmp_path / "x.jsonl",
            tokenizer,
            [512],
            per_bucket=1,
            min_tokens=600,
            max_tokens=700,
            heldout_share=0.0,
        )


def test_shipped_long_context_set_fills_the_default_buckets(tokenizer, demo_model_dir):
    """resources/eval/long_context.jsonl: small, every row's length and provenance as built,
    and no row a demo training prompt."""
    from draftsmith.formats.datasets.load import load_prompts
    from draftsmith.formats.prompt_sets import prompt_hash

    path = REPO / "resources/eval/long_context.jsonl"
    assert path.stat().st_size < 200_000
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    for row in rows:
        assert set(row) == PROVENANCE and row["prompt_tokens"] == _tokens(tokenizer, row["prompt"])
    filled = {bucket_of(r["prompt_tokens"], [512, 2048, 8192]).label for r in rows}
    assert filled == {"<512", "512-2k", "2k-8k"}  # >=8k is beyond the demo target's context
    formats = {"chat": "messages", "code": "prompt", "math": "sharegpt"}
    training = {}
    for name, fmt in formats.items():
        entry = {
            "path": str(REPO / f"resources/datasets/{name}.jsonl"),
            "format": fmt,
            "prompt_field": "prompt",
        }
        training.update({prompt_hash(p.messages): p.id for p in load_prompts(name, entry).prompts})
    entry = {"path": str(path), "format": "prompt", "prompt_field": "prompt", "max_prompts": None}
    check_overlap({"long": load_prompt_set("long", entry, tokenizer, None)}, training)
