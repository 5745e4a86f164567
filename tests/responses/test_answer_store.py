"""The answer store end to end on the demo model (hf backend): after a full `responses` run,
each edit of the data generates only the prompts it adds or changes, and a prompt two
datasets share is generated once."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from conftest import snakemake, workflow_config, write_rows

from draftsmith.store import manifest
from draftsmith.workflow import configure

pytestmark = pytest.mark.slow

FIRST = ["Name a primary colour.", "What is 2 + 2?", "Say hi.", "Name a planet."]
SECOND = ["Name a planet.", "Count to three.", "Name a fruit.", "What does ls do?"]


def stats(config: dict, dataset: str) -> dict:
    """The responses manifest's answer counts of `dataset` under `config`."""
    path = configure(copy.deepcopy(config)).plan.responses[dataset].manifest
    found = manifest.read(path)["stats"]
    return {"generated": found["answers_generated"], "reused": found["answers_reused"]}


def records(config: dict, dataset: str) -> list[dict]:
    path = configure(copy.deepcopy(config)).plan.responses[dataset].path("responses")
    return [json.loads(line) for line in path.read_text().splitlines()]


def answer(tmp_path: Path, config: dict) -> None:
    """Run the workflow up to every dataset's responses (the rule has a dataset wildcard)."""
    plan = configure(copy.deepcopy(config)).plan
    snakemake(tmp_path, config, *(str(a.manifest) for a in plan.responses.values()))


def test_each_edit_generates_only_what_it_changes(tmp_path: Path, demo_model_dir):
    sources = {
        "first": write_rows(tmp_path / "first.jsonl", FIRST),
        "second": write_rows(tmp_path / "second.jsonl", SECOND),
    }
    config = workflow_config(tmp_path, demo_model_dir, sources)
    config["generation"]["max_new_tokens"] = 6
    config["datasets"]["second"]["max_samples"] = 3
    answer(tmp_path, config)
    # Six distinct prompts, "Name a planet." in both datasets: generated once, in one of them.
    counts = [stats(config, "first"), stats(config, "second")]
    assert sum(c["generated"] for c in counts) == 6 and sum(c["reused"] for c in counts) == 1
    before = records(config, "first")
    shared = [r for r in records(config, "second") if r["messages"] == before[3]["messages"]]
    assert shared[0]["response"] == before[3]["response"]
    assert shared[0]["id"] == "second-000000" and shared[0]["dataset"] == "second"

    # Appending rows: only the new rows are generated; the others are the same records.
    write_rows(sources["first"], [*FIRST, "Name a colour of the sky.", "Name a tree."])
    answer(tmp_path, config)
    assert stats(config, "first") == {"generated": 2, "reused": 4}
    assert records(config, "first")[:4] == before

    # Fixing one row: only that row.
    write_rows(
        sources["first"],
        [FIRST[0], "What is 3 + 3?", *FIRST[2:], "Name a colour of the sky.", "Name a tree."],
    )
    answer(tmp_path, config)
    assert stats(config, "first") == {"generated": 1, "reused": 5}
    fixed = records(config, "first")
    assert [fixed[i] for i in (0, 2, 3)] == [before[i] for i in (0, 2, 3)]

    # Raising max_samples: only the extra prompt.
    config["datasets"]["second"]["max_samples"] = 4
    answer(tmp_path, config)
    assert stats(config, "second") == {"generated": 1, "reused": 3}

    # Ten prompts answered, each once, in one answer store.
    (store,) = {configure(copy.deepcopy(config)).plan.answers[n] for n in sources}
    lines = (store / "answers.jsonl").read_text().splitlines()
    assert len(lines) == len({json.loads(line)["address"] for line in lines}) == 10
    key = configure(copy.deepcopy(config)).plan.responses["second"].key
    log = (tmp_path / "logs" / "responses" / "second" / f"{key}.log").read_text()
    assert "second: 4 prompts, 3 already answered in the store, 1 to generate" in log
