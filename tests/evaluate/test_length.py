"""Acceptance by prompt length and the long-context flag, as pure functions of rows and results."""

from __future__ import annotations

import pytest

from draftsmith.evaluate.length import (
    by_length,
    length_markdown,
    long_context,
    long_context_markdown,
)
from draftsmith.formats.prompt_sets import Bucket, buckets

DRAFT = {"training_max_length": 512, "max_position_embeddings": 8192, "rope_scaling": None}


def test_buckets_are_labelled_by_their_bounds():
    assert [b.label for b in buckets([512, 2048, 8192])] == ["<512", "512-2k", "2k-8k", ">=8k"]
    assert buckets([16, 64]) == [Bucket("<16", 0, 15), Bucket("16-64", 16, 63), Bucket(">=64", 64, None)]
    assert buckets([]) == [Bucket("all", 0, None)]


def _rows(prompt_set: str, prompt_tokens: int, runs: dict[str, tuple[int, int]]) -> list[dict]:
    """A prompt's per-prompt rows: the baseline, then per setting (tokens, verify steps)."""
    rows = [{"prompt_set": prompt_set, "setting": "baseline", "prompt_tokens": prompt_tokens, "tokens": 9}]
    for label, (tokens, steps) in runs.items():
        row = {"prompt_set": prompt_set, "setting": label, "prompt_tokens": prompt_tokens}
        rows.append(row | {"tokens": tokens, "verify_steps": steps})
    return rows


def test_by_length_weights_buckets_by_verify_steps_and_leaves_empty_ones_out():
    rows = [
        *_rows("a", 20, {"k=1": (9, 5), "tree 2/2/4": (9, 3)}),
        *_rows("a", 40, {"k=1": (13, 8), "tree 2/2/4": (13, 4)}),
        *_rows("a", 100, {"k=1": (9, 8), "tree 2/2/4": (1, 0)}),  # the prefill's token only
        *_rows("b", 3, {"k=1": (5, 2), "tree 2/2/4": (5, 2)}),
    ]
    table = by_length(rows, [16, 64])
    assert [(b["bucket"], b["prompts"]) for b in table["a"]] == [("16-64", 2), (">=64", 1)]
    assert [(b["bucket"], b["prompts"]) for b in table["b"]] == [("<16", 1)]
    short, long = table["a"]
    assert short["settings"] == {"k=1": (8 + 12) / 13, "tree 2/2/4": (8 + 12) / 7}
    assert short["verify_steps"] == {"k=1": 13, "tree 2/2/4": 7}
    assert long["settings"] == {"k=1": 1.0, "tree 2/2/4": None}  # no verify step: no AL
    # The verify-step-weighted mean of the bucket ALs is the set's AL.
    set_al = (8 + 12 + 8) / (5 + 8 + 8)
    weighted = sum(b["settings"]["k=1"] * b["verify_steps"]["k=1"] for b in table["a"]) / 21
    assert weighted == pytest.approx(set_al)
    markdown = length_markdown({"by_length": table["a"]})
    assert "| prompt tokens | prompts | k=1 | tree 2/2/4 |" in markdown
    assert "| >=64 | 1 | 1.00 | n/a |" in markdown


def _prompt_set(lengths: dict[str, float], speedups: dict[str, float]) -> dict:
    """A benchmark.json prompt set: chains k=1 and k=3, AL of the compared setting per bucket."""
    return {
        "by_k": {k.removeprefix("k="): {"speedup": s} for k, s in speedups.items()},
        "by_tree": {},
        "by_length": [
            {"bucket": bucket, "prompts": 2, "settings": {label: al for label in speedups}}
            for bucket, al in lengths.items()
        ],
    }


RECOMMENDED = {"setting": "k=3"}


def test_a_collapsing_long_bucket_is_flagged_with_its_numbers():
    sets = {
        "chat": _prompt_set({"<512": 2.5, "512-2k": 2.4}, {"k=1": 1.2, "k=3": 1.8}),
        "long": _prompt_set({"<512": 2.5, "512-2k": 2.3, "2k-8k": 1.25}, {"k=1": 1.2, "k=3": 1.8}),
    }
    flag = long_context(sets, RECOMMENDED, 0.8, DRAFT)
    assert flag["flagged"] is True and flag["threshold"] == 0.8
    assert flag["buckets"] == [
        {
            "prompt_set": "long",
            "setting": "k=3",
            "bucket": "2k-8k",
            "prompts": 2,
            "acceptance_length": 1.25,
            "reference_bucket": "<512",
            "reference_acceptance_length": 2.5,
            "share": 0.5,
        }
    ]
    reason = flag["reason"]
    assert "prompt set `long`, k=3: acceptance length 1.25 at 2k-8k prompt tokens (2 prompts)" in reason
    assert "50% of 2.50 at <512" in reason and "below evaluate.long_context_drop 80%" in reason
    assert "at most 512 tokens (tokenize.max_length)" in reason
    assert "max_position_embeddings 8192" in reason and "plain RoPE (no rope_scaling)" in reason
    warning = long_context_markdown(flag)
    assert warning.startswith("**Long-context warning:** prompt set `long`")


def test_no_flag_when_every_bucket_holds_up_or_nothing_compares():
    holding = {"long": _prompt_set({"<512": 2.5, "512-2k": 2.1, "2k-8k": 2.0}, {"k=1": 1.2, "k=3": 1.8})}
    flag = long_context(holding, RECOMMENDED, 0.8, DRAFT)
    assert flag["flagged"] is False and flag["buckets"] == []
    assert "at least 80%" in flag["reason"] and long_context_markdown(flag) == ""
    single = {"chat": _prompt_set({"<512": 2.5}, {"k=1": 1.2, "k=3": 1.8})}
    flag = long_context(single, RECOMMENDED, 0.8, DRAFT)
    assert flag["flagged"] is False and "nothing to compare" in flag["reason"]


def test_without_a_recommendation_the_fastest_chain_is_compared():
    prompt_set = _prompt_set({"<512": 2.0, "2k-8k": 1.5}, {"k=1": 1.4, "k=3": 1.1})
    prompt_set["by_length"][1]["settings"]["k=3"] = 0.5  # only k=3 collapses
    assert long_context({"s": prompt_set}, None, 0.7, {})["flagged"] is False  # k=1 is compared
    assert long_context({"s": prompt_set}, RECOMMENDED, 0.7, {})["flagged"] is True
