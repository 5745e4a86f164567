"""The settings the search job reads, resolved once by `workflow.configure`: the prompt set it
decodes, its grid (built and checked here, once) and its halving schedule. How it decodes
(device, dtype, max_new_tokens, warm-up, the launch context) is the evaluator's
(`EvaluateSettings`): the search decodes with the built-in evaluator.

No torch here: config validation imports this module.
"""

from __future__ import annotations

from dataclasses import dataclass

from draftsmith.config import search_prompt_set
from draftsmith.errors import ConfigError
from draftsmith.evaluate import PromptSetEntry
from draftsmith.search.grid import Grid, build_grid

SECTION = "search"


@dataclass(frozen=True)
class SearchSettings:
    """The grid the search halves over, the held-out prompt set it decodes, and its schedule."""

    prompt_set: PromptSetEntry  # search.prompt_set, else the first of evaluate.prompt_sets by name
    # The grid's lists, ascending (their order does not matter: search.json shows them sorted).
    num_steps: tuple[int, ...]
    topk: tuple[int, ...]
    num_draft_tokens: tuple[int, ...]
    grid: Grid  # the lists' valid settings for the trained draft (never none), and the skipped
    first_prompts: int
    eta: int

    @classmethod
    def of(cls, config: dict) -> SearchSettings:
        """Refuses a prompt set evaluate does not define, and a grid with no valid setting."""
        search, train = config[SECTION], config["train"]
        name, sets = search_prompt_set(config), config["evaluate"]["prompt_sets"]
        if name not in sets:
            known = sorted(sets) or "none configured"
            raise ConfigError(
                f"{SECTION}.prompt_set: {name!r} is not a set of evaluate.prompt_sets (known: {known})"
            )
        entry = sets[name]
        lists = {key: tuple(sorted(search[key])) for key in ("num_steps", "topk", "num_draft_tokens")}
        grid = build_grid(**lists, ttt_steps=train["ttt_steps"], draft_vocab_size=train["draft_vocab_size"])
        if not grid.settings:
            reasons = "; ".join(dict.fromkeys(skip.reason for skip in grid.skipped))
            raise ConfigError(
                f"{SECTION}: no valid setting in num_steps {search['num_steps']} x topk {search['topk']} x "
                f"num_draft_tokens {search['num_draft_tokens']}: {reasons}"
            )
        return cls(
            prompt_set=PromptSetEntry.of(name, entry),
            **lists,
            grid=grid,
            first_prompts=search["first_prompts"],
            eta=search["eta"],
        )
