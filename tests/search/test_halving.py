"""Successive halving on synthetic measurements: rounds, survivors, prompt doubling, ties."""

from __future__ import annotations

import math

import pytest

from draftsmith.search.halving import ranking, schedule, successive_halving


class Recorder:
    """A measure callback: fixed scores per candidate (or per candidate and prompts), calls kept."""

    def __init__(self, scores):
        self.scores = scores
        self.calls: list[tuple[list[str], int]] = []

    def __call__(self, alive: list[str], prompts: int) -> dict[str, float]:
        self.calls.append((list(alive), prompts))
        return {c: self.scores(c, prompts) if callable(self.scores) else self.scores[c] for c in alive}


@pytest.mark.parametrize(
    ("counts", "rounds"),
    [
        ((14, 1, 6, 2), [(14, 1), (7, 2), (4, 4), (2, 6)]),  # the set runs out: 2 left on all 6
        ((8, 1, 30, 2), [(8, 1), (4, 2), (2, 4), (1, 30)]),  # one left: measured on every prompt
        ((9, 2, 100, 3), [(9, 2), (3, 4), (1, 100)]),
        ((1, 2, 6, 2), [(1, 2), (1, 6)]),
        ((5, 10, 6, 2), [(5, 6)]),  # more first prompts than the set has: one round on all
        ((3, 6, 6, 2), [(3, 6)]),
    ],
)
def test_schedule(counts, rounds):
    assert schedule(*counts) == rounds


def test_schedule_refuses_what_cannot_halve():
    with pytest.raises(ValueError, match="eta >= 2"):
        schedule(4, 1, 8, 1)
    with pytest.raises(ValueError, match="candidates"):
        schedule(0, 1, 8, 2)


def test_rounds_keep_the_best_and_double_the_prompts():
    names = [f"s{i}" for i in range(10)]
    # s6 best, then s5, s4, s3; s2 ties s9 (s2 comes first).
    measure = Recorder({name: float(i % 7) for i, name in enumerate(names)})
    rounds = successive_halving(names, 1, 12, 2, measure)
    assert [(len(alive), prompts) for alive, prompts in measure.calls] == [
        (10, 1),
        (5, 2),
        (3, 4),
        (2, 8),
        (1, 12),
    ]
    assert [(r.number, r.prompts) for r in rounds] == [(1, 1), (2, 2), (3, 4), (4, 8), (5, 12)]
    for before, after in zip(rounds, rounds[1:], strict=False):
        kept = sorted(before.scores, key=lambda c: -before.scores[c])[: math.ceil(len(before.scores) / 2)]
        assert set(after.scores) == set(kept)
    assert list(rounds[-1].scores) == ["s6"]
    ranked = ranking(names, rounds)
    assert [c for c, _ in ranked][:3] == ["s6", "s5", "s4"]
    assert [r.number for _, r in ranked] == sorted((r.number for _, r in ranked), reverse=True)
    assert {c for c, _ in ranked} == set(names)


def test_ties_go_to_the_earlier_candidate_every_time():
    names = ["a", "b", "c", "d", "e"]
    rounds = successive_halving(names, 1, 4, 2, Recorder(dict.fromkeys(names, 1.0)))
    assert [list(r.scores) for r in rounds] == [names, ["a", "b", "c"], ["a", "b"]]
    assert [c for c, _ in ranking(names, rounds)] == names
    again = successive_halving(names, 1, 4, 2, Recorder(dict.fromkeys(names, 1.0)))
    assert again == rounds


def test_later_rounds_decide_on_their_own_scores():
    """A setting that led on one prompt but falls behind on more is ranked by the later round."""

    def score(candidate: str, prompts: int) -> float:
        return {"fast start": 3.0 if prompts == 1 else 1.0, "steady": 2.0, "slow": 0.5}[candidate]

    rounds = successive_halving(["fast start", "steady", "slow"], 1, 2, 2, Recorder(score))
    assert rounds[-1].scores == {"fast start": 1.0, "steady": 2.0}
    assert [c for c, _ in ranking(["fast start", "steady", "slow"], rounds)] == [
        "steady",
        "fast start",
        "slow",
    ]


def test_a_measure_that_skips_a_candidate_is_an_error():
    with pytest.raises(ValueError, match="round 1: scores for"):
        successive_halving(["a", "b"], 1, 2, 2, lambda alive, _n: {"a": 1.0})
