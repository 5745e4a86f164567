"""The `draftsmith` command: plan lists what configure() plans, config errors exit 2, the
console script and `python -m draftsmith` both start it."""

from __future__ import annotations

import copy
import importlib.metadata
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import stand_in_config

from draftsmith import cli
from draftsmith.store import manifest
from draftsmith.store.keys import STAGES
from draftsmith.workflow import configure


@pytest.fixture
def config(tmp_path: Path) -> dict:
    """A raw config over a stand-in target directory and two small prompt files."""
    return stand_in_config(tmp_path)


def write_config(path: Path, config: dict) -> Path:
    path.write_text(yaml.safe_dump(config))
    return path


def plan_json(capsys, *configfiles: Path) -> list[dict]:
    args = [arg for path in configfiles for arg in ("--configfile", str(path))]
    assert cli.main(["plan", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_plan_prints_every_stage_and_key(tmp_path, config, capsys):
    path = write_config(tmp_path / "config.yaml", config)
    plan = configure(copy.deepcopy(config)).plan
    assert cli.main(["plan", "--configfile", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["stage", "dataset", "key", "built", "directory"]
    rows = [line.split() for line in lines[1:]]
    assert [row[0] for row in rows] == [a.stage for a in plan.artifacts]
    assert {row[0] for row in rows} == set(STAGES)
    assert [row[2] for row in rows] == [a.key for a in plan.artifacts]
    assert [row[1] for row in rows if row[0] == "responses"] == ["chat", "code"]
    assert {row[3] for row in rows} == {"no"}


def test_plan_json_lists_the_keys_configure_plans(tmp_path, config, capsys):
    rows = plan_json(capsys, write_config(tmp_path / "config.yaml", config))
    plan = configure(copy.deepcopy(config)).plan
    assert [(r["stage"], r["key"], r["directory"]) for r in rows] == [
        (a.stage, a.key, str(a.directory)) for a in plan.artifacts
    ]
    assert {r["dataset"] for r in rows if r["stage"] in ("responses", "tokens")} == {"chat", "code"}
    assert {r["dataset"] for r in rows if r["stage"] not in ("responses", "tokens")} == {None}


def test_plan_reports_what_is_built(tmp_path, config, capsys):
    path = write_config(tmp_path / "config.yaml", config)
    plan = configure(copy.deepcopy(config)).plan
    plan.model.path("info").parent.mkdir(parents=True)
    plan.model.path("info").write_text("{}")
    manifest.write(plan.model, plan.model.manifest, [plan.model.path("info")], {}, time.time())
    # A mix's view of the hidden states is built once it and every shard it names exist.
    plan.hidden.directory.mkdir(parents=True)
    plan.hidden.path("assignment").write_text(json.dumps({"shards": ["shard-0123456789abcdef"]}))
    plan.hidden.manifest.write_text("{}")
    assert {r["stage"] for r in plan_json(capsys, path) if r["built"]} == {"model"}
    plan.states.directory.mkdir(parents=True)
    plan.shard("shard-0123456789abcdef").write_text("{}")
    built = [(r["stage"], r["key"]) for r in plan_json(capsys, path) if r["built"]]
    assert built == [("model", plan.model.key), ("hidden", plan.states.key), ("hidden", plan.hidden.key)]


def test_later_configfiles_win(tmp_path, config, capsys):
    base = write_config(tmp_path / "base.yaml", config)
    overlay = write_config(tmp_path / "overlay.yaml", {"merge": {"seed": 7}, "train": {"lr": 0.01}})
    rows = plan_json(capsys, base, overlay)
    merged = copy.deepcopy(config)
    merged["merge"]["seed"] = 7
    merged["train"] = {"lr": 0.01}
    assert [r["key"] for r in rows] == [a.key for a in configure(merged).plan.artifacts]
    assert rows != plan_json(capsys, base)


def test_a_bad_key_exits_2_naming_it(tmp_path, config, capsys):
    config["train"] = {"lr": "fast"}
    path = write_config(tmp_path / "config.yaml", config)
    assert cli.main(["plan", "--configfile", str(path)]) == 2
    err = capsys.readouterr().err
    assert "train.lr" in err and str(path) in err
    assert "Traceback" not in err


def test_a_missing_configfile_exits_2(tmp_path, capsys):
    assert cli.main(["plan", "--configfile", str(tmp_path / "absent.yaml")]) == 2
    assert "absent.yaml" in capsys.readouterr().err


def test_verify_defaults_to_the_configs_store(tmp_path, config, capsys):
    path = write_config(tmp_path / "config.yaml", config)
    model = configure(copy.deepcopy(config)).plan.model
    model.directory.mkdir(parents=True)
    model.path("info").write_text("{}")
    manifest.write(model, model.manifest, [model.path("info")], {}, time.time())
    # Everything but the model is still to be built: verify names each missing artifact.
    assert cli.main(["verify", "--configfile", str(path)]) == 1
    out = capsys.readouterr().out
    assert "verify: 1 checked, 0 corrupt" in out and f"MISSING {model.manifest}" not in out
    plan = configure(copy.deepcopy(config)).plan
    assert all(f"MISSING {a.manifest}" in out for a in plan.built if a.stage != "model")
    model.path("info").write_text("{ }")
    assert cli.main(["verify", "--configfile", str(path), "--fix"]) == 1
    assert not model.manifest.exists()


def test_console_script_is_installed():
    (script,) = [
        e for e in importlib.metadata.entry_points(group="console_scripts") if e.name == "draftsmith"
    ]
    assert script.load() is cli.main


def test_python_dash_m_runs_the_command():
    result = subprocess.run([sys.executable, "-m", "draftsmith", "--help"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    for command in ("plan", "verify", "gc", "migrate"):
        assert command in result.stdout


def test_verify_rehash_sources_sees_an_edit_that_kept_size_mtime_and_inode(tmp_path, config, capsys):
    """The hash cache trusts (size, mtime, inode); `verify --rehash-sources` hashes again."""
    import os

    path = write_config(tmp_path / "config.yaml", config)
    before = {r["key"] for r in plan_json(capsys, path) if r["stage"] == "responses"}
    source = Path(config["datasets"]["chat"]["path"])
    stat = source.stat()
    with source.open("r+b") as handle:  # same size, same inode
        text = handle.read()
        handle.seek(0)
        handle.write(text.replace(b"chat", b"tahc"))
    os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert {r["key"] for r in plan_json(capsys, path) if r["stage"] == "responses"} == before
    cli.main(["verify", "--configfile", str(path), "--rehash-sources"])
    capsys.readouterr()
    after = {r["key"] for r in plan_json(capsys, path) if r["stage"] == "responses"}
    assert len(after - before) == 1  # chat's key follows its content now; code's is unchanged
