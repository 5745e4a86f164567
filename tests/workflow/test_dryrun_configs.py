"""Every shipped config validates, dry-runs, and draws its DAG (model files absent is fine)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import REPO, snakemake_cmd

CONFIGS = [REPO / "config.yaml", *sorted((REPO / "configs").glob("*.yaml"))]


def smk(config: Path, *args: str) -> subprocess.CompletedProcess:
    """The workflow over the repository itself, read-only (no lock), with `config`."""
    cmd = snakemake_cmd(REPO, config, "--nolock", *args)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def fast_for_the_default(configs: list[Path]) -> list:
    """The default config in the fast subset, the production configs (a Snakemake start
    each) in the full suite."""
    return [pytest.param(c, marks=[] if c == CONFIGS[0] else [pytest.mark.slow]) for c in configs]


@pytest.mark.parametrize("config", fast_for_the_default(CONFIGS), ids=lambda p: p.name)
def test_dry_run_shows_the_plan(config):
    result = smk(config, "-n", "merged")
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout + result.stderr
    assert "Nothing to be done" in out or "merge" in out
    if config.parent.name == "configs":  # production sources are absent here: named, not fatal
        assert "source not found" in out


def graph_cases() -> list:
    """Every config with either graph. The fast subset draws the README's picture (the
    default rule graph); the other seven are slow: each is a Snakemake start, and the dry
    run above already builds every config's DAG there."""
    cases = [(config, graph) for config in CONFIGS for graph in ("--rulegraph", "--dag")]
    return [
        pytest.param(*case, marks=[] if case == (CONFIGS[0], "--rulegraph") else [pytest.mark.slow])
        for case in cases
    ]


@pytest.mark.parametrize(("config", "graph"), graph_cases(), ids=lambda v: getattr(v, "name", v))
def test_graph_renders_with_dot(config, graph):
    dot = shutil.which("dot")
    if dot is None:
        pytest.skip("graphviz is not installed (.ci/run installs it)")
    result = smk(config, "merged", graph)
    assert result.returncode == 0 and result.stdout.lstrip().startswith("digraph"), result.stderr[-2000:]
    svg = subprocess.run([dot, "-Tsvg"], input=result.stdout, capture_output=True, text=True, check=True)
    assert "<svg" in svg.stdout and "merge" in svg.stdout


def test_nested_values_given_with_config_mean_what_a_config_file_means(tmp_path):
    """Snakemake reads `search={enabled: false}` with every scalar a string ('false'); the
    workflow reads it as YAML, so the override applies instead of failing validation."""

    def search_jobs(value: str) -> bool:
        # An empty working directory: the dry run plans every job (the sources are named absent).
        cmd = snakemake_cmd(tmp_path, REPO / "config.yaml", "-n", "--quiet", "rules", "--config", value)
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr[-3000:]
        return re.search(r"^search\s+1$", result.stdout, re.MULTILINE) is not None

    assert search_jobs("search={enabled: true}") and not search_jobs("search={enabled: false}")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("rule", "override"),
    [("serve_bench", []), ("evaluate", ["--config", "evaluate={enabled: false}"])],
)
def test_the_rule_of_a_stage_turned_off_is_refused_before_any_job(tmp_path, rule, override):
    """A stage that is off has no settings (none are checked): asking for its rule names why."""
    cmd = snakemake_cmd(tmp_path, REPO / "config.yaml", "-n", rule, *override)
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert f"stage {rule} is off in this config" in result.stdout + result.stderr
