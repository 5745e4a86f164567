"""A store built by the code before the answer store (commit 85e0c40) upgrades with
`draftsmith migrate`: afterwards no answer it holds is generated again."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import tarfile
from io import BytesIO
from pathlib import Path

import pytest
import yaml
from conftest import REPO, snakemake, snakemake_cmd, workflow_config, write_rows

from draftsmith.store import manifest
from draftsmith.workflow import configure

pytestmark = pytest.mark.slow

BEFORE = "85e0c40"  # the last commit whose responses kept their answers in per-artifact journals
CHAT = ["Name a primary colour.", "What is 2 + 2?", "Say hi."]
CODE = ["What does ls do?", "Say hi."]


def old_checkout(target: Path) -> Path:
    archive = subprocess.run(["git", "-C", str(REPO), "archive", BEFORE], capture_output=True)
    if archive.returncode != 0:
        pytest.skip(f"commit {BEFORE} is not in this checkout's history")
    with tarfile.open(fileobj=BytesIO(archive.stdout)) as tar:
        tar.extractall(target, filter="data")
    return target


def test_a_store_of_the_previous_commit_is_answered_without_a_request(tmp_path, demo_model_dir):
    old = old_checkout(tmp_path / "old")
    sources = {
        "chat": write_rows(tmp_path / "chat.jsonl", CHAT),
        "code": write_rows(tmp_path / "code.jsonl", CODE),
    }
    config = workflow_config(tmp_path, demo_model_dir, sources)
    config["generation"]["max_new_tokens"] = 6
    plan = configure(copy.deepcopy(config)).plan
    targets = [str(a.manifest) for a in plan.responses.values()]
    config_path = tmp_path / "config.yaml"
    config_path.write_text(yaml.safe_dump(config))
    command = snakemake_cmd(tmp_path, config_path, *targets)
    command[command.index("-s") + 1] = str(old / "Snakefile")
    env = {**os.environ, "PYTHONPATH": str(old / "src")}
    built = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
    assert built.returncode == 0, built.stderr[-3000:]
    assert sorted(p.name for p in plan.responses["chat"].directory.iterdir()) == [
        "bad_rows.jsonl",
        "journal.jsonl",
        "manifest.json",
        "responses.jsonl",
    ]
    old_records = {n: plan.responses[n].path("responses").read_text() for n in sources}

    migrated = subprocess.run(
        [sys.executable, "-m", "draftsmith", "migrate", str(plan.root)], capture_output=True, text=True
    )
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    assert migrated.stdout.count("import ") == 2  # "Say hi." is in both: stored once
    store = plan.answers["chat"]
    assert len((store / "answers.jsonl").read_text().splitlines()) == 4

    # The responses keys did not change; rebuilt from scratch, every answer comes from the store.
    for artifact in plan.responses.values():
        for path in artifact.directory.iterdir():
            path.unlink()
    snakemake(tmp_path, config, *targets)
    for name, artifact in plan.responses.items():
        stats = manifest.read(artifact.manifest)["stats"]
        assert (stats["answers_generated"], stats["answers_reused"]) == (
            0,
            len(sources[name].read_text().splitlines()),
        )
        assert artifact.path("responses").read_text() == old_records[name]
