"""The merged stage's settings: the merge's references to datasets checked as they are built,
and the datasets and caps it merges."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from draftsmith import config as cfg
from draftsmith.errors import ConfigError
from draftsmith.merged.settings import MergedSettings

DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "config.yaml"


@pytest.fixture
def raw() -> dict:
    """The default config as written (datasets chat, code, math and tools)."""
    return yaml.safe_load(DEFAULT_CONFIG.read_text())


def error_of(config: dict) -> str:
    with pytest.raises(ConfigError) as info:
        MergedSettings.of(cfg.validate(config))
    return str(info.value)


def test_merge_exclude_unknown_dataset(raw):
    raw["merge"]["exclude"] = ["chat", "poetry"]
    assert error_of(raw) == (
        "merge.exclude: unknown dataset(s) ['poetry'] (known: ['chat', 'code', 'math', 'tools'])"
    )


def test_merge_caps_unknown_dataset(raw):
    raw["merge"]["caps"] = {"poetry": 3}
    assert "merge.caps: unknown dataset(s) ['poetry']" in error_of(raw)


def test_nothing_left_to_merge(raw):
    raw["datasets"]["chat"]["enabled"] = False
    raw["merge"]["exclude"] = ["code", "math", "tools"]
    assert "no dataset is both enabled and not excluded from the merge" in error_of(raw)


def test_merged_datasets_and_their_caps(raw):
    raw["datasets"]["math"]["enabled"] = False
    raw["merge"].update(exclude=["tools"], caps={"tools": 2, "code": 5, "math": 1}, seed=7)
    settings = MergedSettings.of(cfg.validate(raw))
    assert settings.datasets == ("chat", "code")  # enabled, not excluded, sorted
    assert settings.caps == (("code", 5),)  # a dataset that does not merge has no cap
    assert (settings.seed, settings.excluded, settings.max_length) == (7, ("tools",), 512)
