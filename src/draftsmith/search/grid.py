"""The settings search's grid: every valid (num_steps, topk, num_draft_tokens) of the
`search` lists, and the config check.

A combination is skipped, with its reason, rather than failing the run: the grid is a
cross product, so one impossible corner (8 draft tokens in a 2-step, topk-2 tree that has
7 nodes) should not refuse the rest. Skipped are:
- trees with more draft tokens than nodes (`Speculation.check`);
- num_steps above `train.ttt_steps`: the draft was trained to propose that many tokens
  ahead and no further, so deeper steps run an untrained extrapolation;
- topk above `train.draft_vocab_size` (the draft cannot rank more tokens than it knows).
topk 1 is a chain, which SGLang runs with num_draft_tokens = num_steps + 1 whatever it is
given: it is measured once per num_steps with that count. A grid left empty is an error.

The order (num_steps, then topk, then num_draft_tokens, ascending) is the tie-break of
the search: of equal speed-ups the smaller setting wins.

No torch here: config validation imports this module.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import product

from draftsmith.config import search_prompt_set
from draftsmith.errors import ConfigError
from draftsmith.speculation import Speculation

SECTION = "search"


@dataclass(frozen=True)
class Skipped:
    setting: Speculation
    reason: str

    def as_json(self) -> dict:
        return {**self.setting.as_json(), "reason": self.reason}


@dataclass(frozen=True)
class Grid:
    settings: list[Speculation]  # in search order: ascending num_steps, topk, num_draft_tokens
    skipped: list[Skipped]


def build_grid(config: dict) -> Grid:
    """The valid settings of `search`'s lists for the draft `train` describes, and the skipped ones."""
    search = config[SECTION]
    settings, skipped = [], []
    for num_steps, topk in product(sorted(search["num_steps"]), sorted(search["topk"])):
        if topk == 1:  # a chain: one num_draft_tokens only (`Speculation.check`)
            candidates = [Speculation.chain(num_steps)]
        else:
            candidates = [Speculation(num_steps, topk, n) for n in sorted(search["num_draft_tokens"])]
        for setting in candidates:
            reason = _refusal(setting, config["train"])
            if reason:
                skipped.append(Skipped(setting, reason))
            else:
                settings.append(setting)
    return Grid(settings, skipped)


def _refusal(setting: Speculation, train: dict) -> str | None:
    """Why the search does not measure `setting` (None: it does)."""
    if setting.num_steps > train["ttt_steps"]:
        return (
            f"num_steps {setting.num_steps} exceeds train.ttt_steps {train['ttt_steps']}: the draft "
            "was not trained to propose that far ahead"
        )
    if setting.topk > train["draft_vocab_size"]:
        size = train["draft_vocab_size"]
        return f"topk {setting.topk} exceeds the draft vocabulary (train.draft_vocab_size {size})"
    try:
        setting.check()
    except ValueError as exc:
        return str(exc)
    return None


def check_config(config: dict) -> None:
    """Refuse a search on a prompt set evaluate does not define, or a grid with no valid setting."""
    name = search_prompt_set(config)
    sets = config["evaluate"]["prompt_sets"]
    if name not in sets:
        known = sorted(sets) or "none configured"
        raise ConfigError(
            f"{SECTION}.prompt_set: {name!r} is not a set of evaluate.prompt_sets (known: {known})"
        )
    grid = build_grid(config)
    if not grid.settings:
        search = config[SECTION]
        reasons = "; ".join(dict.fromkeys(skip.reason for skip in grid.skipped))
        raise ConfigError(
            f"{SECTION}: no valid setting in num_steps {search['num_steps']} x topk {search['topk']} x "
            f"num_draft_tokens {search['num_draft_tokens']}: {reasons}"
        )
