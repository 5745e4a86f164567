"""The settings search's grid and settings: valid combinations only, chains once per
num_steps, the draft's limits skipped with a reason, and the config checks naming their key."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from draftsmith import config as cfg
from draftsmith.errors import ConfigError
from draftsmith.search.grid import Grid
from draftsmith.search.settings import SearchSettings
from draftsmith.speculation import Speculation
from draftsmith.workflow import configure

REPO = Path(__file__).resolve().parents[2]
RAW = yaml.safe_load((REPO / "config.yaml").read_text())


def config_with(search: dict | None = None, **sections) -> dict:
    """The default config (validated, not planned) with `search` and other sections replaced."""
    raw = copy.deepcopy(RAW)
    raw["search"] = search or {}
    for name, section in sections.items():
        raw[name] = {**raw.get(name, {}), **section}
    return cfg.validate(raw)


def build_grid(config: dict) -> Grid:
    """The grid as the search's settings build it from a validated config."""
    return SearchSettings.of(config).grid


def test_default_grid_is_every_valid_combination_in_order():
    grid = build_grid(config_with())
    chains = [Speculation.chain(k) for k in (2, 3, 4)]
    assert [s for s in grid.settings if s.topk == 1] == chains  # one chain per num_steps
    trees = [s for s in grid.settings if s.topk > 1]
    assert len(trees) == 11 and len(set(trees)) == 11
    for setting in trees:
        setting.check()
    shapes = [(s.num_steps, s.topk, s.num_draft_tokens) for s in grid.settings]
    assert shapes == sorted(shapes)  # the tie-break order: the smaller setting first
    (skipped,) = grid.skipped  # a 2-step, topk-2 tree has 6 nodes: 8 tokens cannot be verified
    assert skipped.setting == Speculation(2, 2, 8)
    assert "num_draft_tokens must be between 2 and 7" in skipped.reason
    assert skipped.as_json() == {"num_steps": 2, "topk": 2, "num_draft_tokens": 8, "reason": skipped.reason}


def test_chains_ignore_num_draft_tokens_and_are_not_repeated():
    grid = build_grid(config_with({"num_steps": [3], "topk": [1], "num_draft_tokens": [2, 4, 9]}))
    assert grid.settings == (Speculation(3, 1, 4),) and grid.skipped == ()


def test_list_order_does_not_matter():
    forward = build_grid(config_with({"num_steps": [2, 3], "topk": [1, 2], "num_draft_tokens": [3, 4]}))
    backward = build_grid(config_with({"num_steps": [3, 2], "topk": [2, 1], "num_draft_tokens": [4, 3]}))
    assert forward == backward


def test_settings_beyond_the_trained_draft_are_skipped_with_the_reason():
    config = config_with(
        {"num_steps": [2, 3], "topk": [1, 2, 8], "num_draft_tokens": [4]},
        train={"ttt_steps": 2, "draft_vocab_size": 4},
    )
    grid = build_grid(config)
    assert grid.settings == (Speculation(2, 1, 3), Speculation(2, 2, 4))
    reasons = {(s.setting.num_steps, s.setting.topk): s.reason for s in grid.skipped}
    assert set(reasons) == {(2, 8), (3, 1), (3, 2), (3, 8)}
    assert reasons[3, 1] == (
        "num_steps 3 exceeds train.ttt_steps 2: the draft was not trained to propose that far ahead"
    )
    assert reasons[2, 8] == "topk 8 exceeds the draft vocabulary (train.draft_vocab_size 4)"


def test_an_empty_grid_is_refused_naming_the_key_and_why():
    with pytest.raises(
        ConfigError, match=r"^search: no valid setting in num_steps \[9\] x topk .*ttt_steps 4"
    ):
        SearchSettings.of(config_with({"num_steps": [9]}))


def test_an_unknown_prompt_set_is_refused_at_configure_time(tmp_path):
    raw = copy.deepcopy(RAW) | {"search": {"prompt_set": "mtbench"}, "artifacts_dir": str(tmp_path)}
    with pytest.raises(
        ConfigError, match=r"search.prompt_set: 'mtbench' is not a set of evaluate.prompt_sets"
    ):
        configure(raw)


@pytest.mark.parametrize(
    ("search", "key"),
    [({"eta": 1}, "search.eta"), ({"topk": []}, "search.topk"), ({"confirm_top": -1}, "search.confirm_top")],
)
def test_schema_bounds_name_the_key(search, key):
    with pytest.raises(ConfigError, match=key):
        config_with(search)


def test_default_prompt_set_is_the_first_by_name_and_off_with_the_evaluator(tmp_path):
    sets = {name: {"path": "x.jsonl"} for name in ("zeta", "alpha")}
    config = config_with(evaluate={"prompt_sets": sets})
    assert cfg.search_prompt_set(config) == "alpha" and cfg.stage_on(config, "search")
    assert cfg.served_search_settings(config) == 3
    entry = SearchSettings.of(config).prompt_set
    assert (entry.name, entry.path, entry.format, entry.max_prompts) == ("alpha", "x.jsonl", "prompt", None)
    config = config_with({"prompt_set": "nowhere"}, evaluate={"enabled": False})
    assert not cfg.stage_on(config, "search") and cfg.served_search_settings(config) == 0
    off = {
        "search": {"prompt_set": "nowhere"},
        "evaluate": {"enabled": False},
        "artifacts_dir": str(tmp_path),
    }
    assert configure(copy.deepcopy(RAW) | off).search is None  # not checked: it does not run


def test_settings_hold_the_sorted_lists_the_grid_and_the_schedule():
    search = {"num_steps": [3, 2], "topk": [2, 1], "num_draft_tokens": [4, 3], "first_prompts": 2, "eta": 3}
    settings = SearchSettings.of(config_with(search))
    assert (settings.num_steps, settings.topk, settings.num_draft_tokens) == ((2, 3), (1, 2), (3, 4))
    assert settings.grid == build_grid(
        config_with({"num_steps": [2, 3], "topk": [1, 2], "num_draft_tokens": [3, 4]})
    )
    assert (settings.first_prompts, settings.eta) == (2, 3)
