"""The settings search's grid: every valid (num_steps, topk, num_draft_tokens) of the
`search` lists.

A combination is skipped, with its reason, rather than failing the run: the grid is a
cross product, so one impossible corner (8 draft tokens in a 2-step, topk-2 tree that has
7 nodes) should not refuse the rest. Skipped are:
- trees with more draft tokens than nodes (`Speculation.check`);
- num_steps above `train.ttt_steps`: the draft was trained to propose that many tokens
  ahead and no further, so deeper steps run an untrained extrapolation;
- topk above `train.draft_vocab_size` (the draft cannot rank more tokens than it knows).
topk 1 is a chain, which SGLang runs with num_draft_tokens = num_steps + 1 whatever it is
given: it is measured once per num_steps with that count. A grid left empty is refused
when the search's settings are built (`SearchSettings.of`).

The order (num_steps, then topk, then num_draft_tokens, ascending) is the tie-break of
the search: of equal speed-ups the smaller setting wins.

No torch here: config validation imports this module.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from itertools import product

from draftsmith.speculation import Speculation


@dataclass(frozen=True)
class Skipped:
    setting: Speculation
    reason: str

    def as_json(self) -> dict:
        return {**self.setting.as_json(), "reason": self.reason}


@dataclass(frozen=True)
class Grid:
    settings: tuple[Speculation, ...]  # in search order: ascending num_steps, topk, num_draft_tokens
    skipped: tuple[Skipped, ...]


def build_grid(
    num_steps: Iterable[int],
    topk: Iterable[int],
    num_draft_tokens: Iterable[int],
    *,
    ttt_steps: int,
    draft_vocab_size: int,
) -> Grid:
    """The valid settings of the lists for a draft trained `ttt_steps` ahead over
    `draft_vocab_size` tokens, and the skipped ones."""
    settings, skipped = [], []
    for steps, k in product(sorted(num_steps), sorted(topk)):
        if k == 1:  # a chain: one num_draft_tokens only (`Speculation.check`)
            candidates = [Speculation.chain(steps)]
        else:
            candidates = [Speculation(steps, k, n) for n in sorted(num_draft_tokens)]
        for setting in candidates:
            reason = _refusal(setting, ttt_steps, draft_vocab_size)
            if reason:
                skipped.append(Skipped(setting, reason))
            else:
                settings.append(setting)
    return Grid(tuple(settings), tuple(skipped))


def _refusal(setting: Speculation, ttt_steps: int, draft_vocab_size: int) -> str | None:
    """Why the search does not measure `setting` (None: it does)."""
    if setting.num_steps > ttt_steps:
        return (
            f"num_steps {setting.num_steps} exceeds train.ttt_steps {ttt_steps}: the draft "
            "was not trained to propose that far ahead"
        )
    if setting.topk > draft_vocab_size:
        return f"topk {setting.topk} exceeds the draft vocabulary (train.draft_vocab_size {draft_vocab_size})"
    try:
        setting.check()
    except ValueError as exc:
        return str(exc)
    return None
