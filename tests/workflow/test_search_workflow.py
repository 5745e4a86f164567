"""The settings search in the workflow: the default config's dry run plans it, it is a
target of its own, and turning it (or the evaluator) off leaves it out."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from conftest import REPO, planned_jobs, snakemake_cmd


def default_config(tmp_path: Path, **sections) -> Path:
    """config.yaml with its store and logs in `tmp_path` (so the dry run plans everything),
    its relative source paths made absolute, and `sections` merged in."""
    raw = yaml.safe_load((REPO / "config.yaml").read_text())
    raw |= {"artifacts_dir": str(tmp_path / "artifacts"), "logs_dir": str(tmp_path / "logs")}
    for entry in [*raw["datasets"].values(), *raw["evaluate"]["prompt_sets"].values()]:
        entry["path"] = str(REPO / entry["path"])
    for name, section in sections.items():
        raw[name] = {**raw.get(name, {}), **section}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def dry_run(tmp_path: Path, config: Path, *targets: str) -> dict[str, int]:
    result = subprocess.run(
        snakemake_cmd(tmp_path, config, "-n", *targets), capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return planned_jobs(result)


def test_the_default_run_plans_the_search(tmp_path):
    jobs = dry_run(tmp_path, default_config(tmp_path))
    assert jobs["search"] == 1 and jobs["evaluate"] == 1 and jobs["report"] == 1
    assert "serve_bench" not in jobs  # the serving benchmark is off by default


def test_search_is_a_target(tmp_path):
    jobs = dry_run(tmp_path, default_config(tmp_path), "search")
    assert jobs["search"] == 1 and jobs["export"] == 1
    assert not {"evaluate", "report", "all"} & set(jobs)


@pytest.mark.slow  # two more Snakemake starts; the plan with the search is the fast check
@pytest.mark.parametrize("off", [{"search": {"enabled": False}}, {"evaluate": {"enabled": False}}])
def test_turning_it_off_leaves_it_out(tmp_path, off):
    jobs = dry_run(tmp_path, default_config(tmp_path, **off))
    assert "search" not in jobs and jobs["report"] == 1
