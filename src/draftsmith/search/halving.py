"""Successive halving, as a pure function of a measuring callback.

Round 1 measures every candidate on the first `first_prompts` prompts. Each next round
keeps the best ceil(n / eta) of its n candidates and doubles the prompts (capped at the
set's size); once one candidate is left it is measured on every prompt, and a round on
every prompt is the last. How many candidates each round holds and on how many prompts
depends only on the counts (`schedule`), so the cost is known before anything runs;
which candidates survive depends on the scores.

Ties are broken by the candidates' order (the earlier wins), so the same scores always
give the same rounds.

No torch here: the grid's tests and the report import this module.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T", bound=Hashable)

# The candidates of a round and the prompts they run on -> each candidate's score there
# (higher is better); the prompts are always the set's first ones.
Measure = Callable[[list[T], int], Mapping[T, float]]


@dataclass(frozen=True)
class Round(Generic[T]):
    number: int  # from 1
    prompts: int  # measured on the set's first `prompts` prompts
    scores: dict[T, float]  # every candidate of the round


def schedule(candidates: int, first_prompts: int, total_prompts: int, eta: int) -> list[tuple[int, int]]:
    """(candidates, prompts) of every round."""
    if candidates < 1 or first_prompts < 1 or total_prompts < 1 or eta < 2:
        raise ValueError(
            f"successive halving needs candidates, first_prompts, total_prompts >= 1 and eta >= 2, got "
            f"{candidates}, {first_prompts}, {total_prompts}, {eta}"
        )
    rounds, prompts = [], min(first_prompts, total_prompts)
    while True:
        rounds.append((candidates, prompts))
        if prompts == total_prompts:
            return rounds
        candidates = math.ceil(candidates / eta)
        prompts = total_prompts if candidates == 1 else min(2 * prompts, total_prompts)


def successive_halving(
    candidates: Sequence[T], first_prompts: int, total_prompts: int, eta: int, measure: Measure
) -> list[Round[T]]:
    """Every round's prompts and scores; `measure` is called once per round."""
    alive, rounds = list(candidates), []
    for number, (size, prompts) in enumerate(schedule(len(alive), first_prompts, total_prompts, eta), 1):
        if rounds:
            alive = best(rounds[-1].scores, candidates)[:size]
        scores = dict(measure(alive, prompts))
        if set(scores) != set(alive):
            raise ValueError(f"round {number}: scores for {sorted(map(str, scores))}, not its candidates")
        rounds.append(Round(number, prompts, scores))
    return rounds


def best(scores: Mapping[T, float], candidates: Sequence[T]) -> list[T]:
    """The scored candidates, best first; equal scores in `candidates` order."""
    order = {candidate: i for i, candidate in enumerate(candidates)}
    return sorted(scores, key=lambda candidate: (-scores[candidate], order[candidate]))


def ranking(candidates: Sequence[T], rounds: Sequence[Round[T]]) -> list[tuple[T, Round[T]]]:
    """Every candidate with the last round it reached, the final ranking first: a later
    round ranks higher (it beat the others on fewer prompts), then the score there."""
    last = {candidate: r for r in rounds for candidate in r.scores}
    return [
        (candidate, r)
        for r in reversed(rounds)
        for candidate in best(r.scores, candidates)
        if last[candidate] is r
    ]
