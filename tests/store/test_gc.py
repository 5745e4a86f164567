"""draftsmith.store.gc and `draftsmith gc`: exactly the directories no given config plans
are listed, and `--delete` removes exactly those."""

from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest
import yaml
from conftest import stand_in_config

from draftsmith import cli
from draftsmith.store import gc
from draftsmith.store.atomic import TMP_PREFIX
from draftsmith.store.plan import Plan
from draftsmith.workflow import configure

STRAY_KEYS = ("0123456789abcdef", "fedcba9876543210")


@pytest.fixture
def configs(tmp_path: Path) -> dict[str, dict]:
    """Two raw configs sharing a store; they differ from the merge on."""
    first = stand_in_config(tmp_path)
    second = copy.deepcopy(first) | {"merge": {"seed": 1}}
    return {"first": first, "second": second}


def config_files(tmp_path: Path, configs: dict[str, dict]) -> dict[str, Path]:
    paths = {name: tmp_path / f"{name}.yaml" for name in configs}
    for name, path in paths.items():
        path.write_text(yaml.safe_dump(configs[name]))
    return paths


def fill(directory: Path, size: int) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "data.bin").write_bytes(b"x" * size)
    return directory


def build_store(plans: list[Plan]) -> tuple[Path, list[Path]]:
    """Every planned directory, strays under key names, and what gc must never take."""
    for plan in plans:
        for artifact in plan.artifacts:
            fill(artifact.directory, 10)
    root = plans[0].root
    strays = [
        fill(root / "train" / STRAY_KEYS[0], 100),
        fill(root / "responses" / "chat" / STRAY_KEYS[1], 1000),
        fill(root / "responses" / "retired" / STRAY_KEYS[0], 5),
    ]
    fill(root / "train" / f"{TMP_PREFIX}{STRAY_KEYS[1]}.x", 1)  # a write in progress
    fill(root / "train" / "notes", 1)  # not named by a key
    fill(root / "draft" / STRAY_KEYS[1], 1)  # not a stage word
    return root, strays


def listed(out: str) -> set[Path]:
    *lines, summary = out.strip().splitlines()
    assert summary.startswith("gc: ")
    return {Path(line.split()[-1]) for line in lines}


def snapshot(root: Path) -> set[Path]:
    return {p for p in root.rglob("*") if p.name != ".hash-cache.json"}


def test_gc_lists_only_what_no_config_plans(tmp_path, configs, capsys):
    plans = [configure(copy.deepcopy(c)) for c in configs.values()]
    root, strays = build_store(plans)
    before = snapshot(root)
    paths = config_files(tmp_path, configs)

    assert cli.main(["gc", "--configfile", str(paths["first"]), "--configfile", str(paths["second"])]) == 0
    out = capsys.readouterr().out
    assert listed(out) == set(strays)
    assert "gc: 3 directories unreferenced" in out and "(1,105 bytes)" in out

    # Planned alone, the first config leaves the second's own artifacts unreferenced.
    assert cli.main(["gc", "--configfile", str(paths["first"])]) == 0
    only_second = {a.directory for a in plans[1].artifacts} - {a.directory for a in plans[0].artifacts}
    assert {a.stage for a in plans[1].artifacts if a.directory in only_second} >= {"merged", "train"}
    assert listed(capsys.readouterr().out) == set(strays) | only_second
    assert snapshot(root) == before


def test_gc_delete_removes_exactly_the_unreferenced(tmp_path, configs, capsys):
    plans = [configure(copy.deepcopy(c)) for c in configs.values()]
    root, strays = build_store(plans)
    before = snapshot(root)
    paths = config_files(tmp_path, configs)
    args = ["gc", "--configfile", str(paths["first"]), "--configfile", str(paths["second"])]

    assert cli.main([*args, "--delete"]) == 0
    assert listed(capsys.readouterr().out) == set(strays)
    removed = {p for p in before if any(p == s or s in p.parents for s in strays)}
    assert snapshot(root) == before - removed
    assert not any(p.name.startswith(f"{TMP_PREFIX}{s.name}.gc-") for s in strays for p in snapshot(root))
    assert all(a.directory.is_dir() for plan in plans for a in plan.artifacts)

    assert cli.main([*args, "--delete"]) == 0
    assert capsys.readouterr().out.startswith("gc: 0 directories deleted")


def test_size_counts_a_hard_linked_file_once_and_follows_no_link(tmp_path):
    directory = fill(tmp_path / "artifact", 300)
    os.link(directory / "data.bin", directory / "again.bin")
    (directory / "elsewhere").symlink_to(fill(tmp_path / "other", 5000), target_is_directory=True)
    assert gc.size(directory) == 300
