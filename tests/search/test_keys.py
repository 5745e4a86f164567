"""The search's key moves with what it measures and nothing else; the serving benchmark's
key takes the search in only when it serves the search's settings."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest

from draftsmith import config as cfg
from draftsmith.store.hashing import HashCache
from draftsmith.store.plan import Plan


def write_rows(path: Path, prompts: list[str]) -> str:
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    return str(path)


@pytest.fixture
def base(tmp_path: Path) -> dict:
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF fake weights")
    return {
        "experiment": "keys",
        "artifacts_dir": str(tmp_path / "artifacts"),
        "model": {"source": {"kind": "gguf", "path": str(model)}},
        "datasets": {"chat": {"path": write_rows(tmp_path / "chat.jsonl", ["hello"]), "format": "prompt"}},
        "evaluate": {
            "prompt_sets": {"held": {"path": write_rows(tmp_path / "held.jsonl", ["a held prompt"])}}
        },
    }


def plan_of(raw: dict, tmp_path: Path) -> Plan:
    return Plan(cfg.validate(copy.deepcopy(raw)), HashCache(tmp_path / "cache.json"))


def changed(raw: dict, section: str, field: str, value) -> dict:
    return {**raw, section: {**raw.get(section, {}), field: value}}


@pytest.mark.parametrize(
    ("section", "field", "value"),
    [
        ("search", "num_steps", [2, 3]),
        ("search", "topk", [1, 2]),
        ("search", "num_draft_tokens", [4, 6]),
        ("search", "first_prompts", 2),
        ("search", "eta", 3),
        ("evaluate", "max_new_tokens", 32),
        ("evaluate", "dtype", "bfloat16"),
        ("evaluate", "device", "cuda"),  # tokens/s are the result
        ("evaluate", "warmup_prompts", 0),
    ],
)
def test_semantic_settings_move_the_search_key_alone(base, tmp_path, section, field, value):
    before = plan_of(base, tmp_path)
    after = plan_of(changed(base, section, field, value), tmp_path)
    assert after.search.key != before.search.key
    assert after.export.key == before.export.key and after.merged.key == before.merged.key


@pytest.mark.parametrize(
    ("section", "field", "value"),
    [
        ("search", "enabled", False),
        ("search", "confirm_top", 1),  # what the serving benchmark does with the result
        ("search", "num_steps", [4, 3, 2]),  # the default grid, written in another order
        ("search", "prompt_set", "held"),  # the set null resolves to
        ("evaluate", "k", [1, 2]),
        ("evaluate", "trees", []),
        ("evaluate", "length_buckets", [128]),
        ("serve_benchmark", "max_new_tokens", 16),
    ],
)
def test_other_settings_leave_the_search_key(base, tmp_path, section, field, value):
    before = plan_of(base, tmp_path).search.key
    assert plan_of(changed(base, section, field, value), tmp_path).search.key == before


def test_the_searched_set_counts_by_content_and_other_sets_do_not(base, tmp_path):
    before = plan_of(base, tmp_path).search.key
    other = write_rows(tmp_path / "other.jsonl", ["another prompt"])
    sets = {**base["evaluate"]["prompt_sets"], "zz_other": {"path": other}}
    assert plan_of(changed(base, "evaluate", "prompt_sets", sets), tmp_path).search.key == before
    picked = changed(changed(base, "evaluate", "prompt_sets", sets), "search", "prompt_set", "zz_other")
    assert plan_of(picked, tmp_path).search.key != before
    write_rows(Path(base["evaluate"]["prompt_sets"]["held"]["path"]), ["a changed prompt"])
    os.utime(base["evaluate"]["prompt_sets"]["held"]["path"], ns=(1, 1))  # the cache rereads it
    assert plan_of(base, tmp_path).search.key != before


def test_serving_takes_the_search_in_only_when_it_serves_its_settings(base, tmp_path):
    served = plan_of(base, tmp_path)
    assert served.serve_bench.upstream["search"] == served.search.key
    alone = plan_of(changed(base, "search", "confirm_top", 0), tmp_path)
    assert "search" not in alone.serve_bench.upstream
    off = plan_of(changed(base, "search", "enabled", False), tmp_path)
    assert off.serve_bench.key == alone.serve_bench.key != served.serve_bench.key
    other_search = plan_of(changed(base, "search", "eta", 3), tmp_path)
    assert other_search.serve_bench.key not in (served.serve_bench.key, alone.serve_bench.key)


def test_the_search_is_built_only_when_it_and_the_evaluator_are_on(base, tmp_path):
    assert "search" in {a.stage for a in plan_of(base, tmp_path).built}
    for section, field in (("search", "enabled"), ("evaluate", "enabled")):
        plan = plan_of(changed(base, section, field, False), tmp_path)
        assert "search" not in {a.stage for a in plan.built}
        assert "search" in {a.stage for a in plan.artifacts}  # still planned (verify, gc)
