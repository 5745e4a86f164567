"""Acceptance by prompt set: the comparison at the recommended setting and its warning."""

from __future__ import annotations

import pytest

from draftsmith.evaluate.sets import by_set, sets_markdown, sets_warning


def _prompt_set(chain_al: dict[int, float], tree_al: float) -> dict:
    by_k = {str(k): {"acceptance_length": al, "speedup": al / 1.5} for k, al in chain_al.items()}
    tree = {"num_steps": 3, "topk": 2, "num_draft_tokens": 6, "acceptance_length": tree_al, "speedup": 1.9}
    return {"by_k": by_k, "by_tree": {"3-2-6": tree}}


SETS = {
    "docstrings": _prompt_set({1: 1.8, 3: 3.1}, 3.4),
    "chat": _prompt_set({1: 1.6, 3: 2.8}, 3.0),
    "math": _prompt_set({1: 1.4, 3: 2.2}, 2.5),
}


def test_each_set_is_compared_with_the_best_at_the_recommended_setting():
    comparison = by_set(SETS, "k=3", 0.85)
    assert comparison["setting"] == "k=3" and comparison["best_set"] == "docstrings"
    assert list(comparison["sets"]) == ["chat", "docstrings", "math"]
    assert comparison["sets"]["chat"]["share_of_best"] == pytest.approx(2.8 / 3.1)
    assert comparison["sets"]["math"]["acceptance_length"] == 2.2
    assert comparison["sets"]["math"]["speedup"] == pytest.approx(2.2 / 1.5)
    assert comparison["flagged"] == ["math"]  # 71% of the best; chat keeps 90%
    reason = comparison["reason"]
    assert reason == (
        "at k=3, acceptance length falls below 85% of the best set's (`docstrings`, 3.10) "
        "on `math` 2.20 (71%)"
    )
    assert sets_warning(comparison).startswith("\n**Prompt-set warning:** at k=3")
    tree = by_set(SETS, "tree 3/2/6", 0.85)
    assert tree["sets"]["math"]["share_of_best"] == pytest.approx(2.5 / 3.4) and tree["flagged"] == ["math"]


def test_sets_that_agree_or_a_single_set_raise_no_warning():
    agreeing = by_set(SETS, "k=3", 0.7)
    assert agreeing["flagged"] == [] and sets_warning(agreeing) == ""
    assert "every prompt set keeps at least 70%" in agreeing["reason"]
    single = by_set({"chat": SETS["chat"]}, "k=1", 0.85)
    assert single["flagged"] == [] and single["sets"]["chat"]["share_of_best"] == 1.0
    assert "nothing to compare" in single["reason"]


def test_the_table_has_a_row_per_set_and_a_column_per_setting():
    comparison = by_set(SETS, "k=3", 0.85)
    text = sets_markdown(comparison, SETS)
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    assert rows[0] == "| prompt set | k=1 | k=3 | tree 3/2/6 | share of best at k=3 |"
    assert rows[1:] == [
        "| `chat` | 1.60 | 2.80 | 3.00 | 90% |",
        "| `docstrings` | 1.80 | 3.10 | 3.40 | 100% |",
        "| `math` | 1.40 | 2.20 | 2.50 | 71% |",
    ]
    assert text.rstrip().endswith("add training data of their kind.")
