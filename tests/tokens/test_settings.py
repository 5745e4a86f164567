"""The tokens stage's settings, per dataset: the supervised floor falls back to the defaults."""

from __future__ import annotations

from conftest import stand_in_config

from draftsmith.workflow import configure


def test_each_dataset_gets_its_floor_or_the_default(tmp_path):
    config = stand_in_config(tmp_path)
    config["dataset_defaults"] = {"min_supervised_share": 0.2}
    config["datasets"]["code"]["min_supervised_share"] = 0.0
    config["tokenize"]["max_roundtrip_mismatch"] = 0.1
    settings = configure(config).tokens
    assert {n: s.min_supervised_share for n, s in settings.items()} == {"chat": 0.2, "code": 0.0}
    assert (settings["chat"].max_length, settings["chat"].max_roundtrip_mismatch) == (256, 0.1)
