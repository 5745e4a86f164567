"""The store's promise, end to end: shared by checkouts, never recomputed by accident,
verified, and rebuilt exactly where it is damaged."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import pipeline_config, planned_jobs, snakemake, snakemake_cmd

pytestmark = pytest.mark.slow

# What may run after a rename or a fresh clone: reports of the run, never a keyed job.
REPORT_JOBS = {"hidden_estimate", "report", "report_html", "all"}


def store_files(root: Path) -> dict[str, tuple[int, int]]:
    """Every artifact file with (inode, mtime_ns), locks and the hash cache aside."""
    return {
        str(p.relative_to(root)): (p.stat().st_ino, p.stat().st_mtime_ns)
        for p in root.rglob("*")
        if p.is_file() and ".locks" not in p.parts and ".hash-cache" not in p.name
    }


def draftsmith(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "draftsmith", *args], capture_output=True, text=True)


@pytest.fixture(scope="module")
def built(tmp_path_factory, demo_model_dir):
    """One finished run of every stage, the search included, its store outside the working
    directory."""
    base = tmp_path_factory.mktemp("promise")
    work, store = base / "checkout", base / "shared store"
    work.mkdir()
    config = pipeline_config(work, demo_model_dir, store, search=True)
    snakemake(work, config)
    assert list(store.glob("search/*/search.json"))  # the one end-to-end run of the search
    return work, config, store


@pytest.fixture
def copied(built, tmp_path):
    """A copy of the built store (times kept) and a config pointing at it."""
    work, config, store = built
    copy = tmp_path / "store copy"
    shutil.copytree(store, copy, symlinks=True)
    config = dict(config, artifacts_dir=str(copy))
    # The reports of this working directory now describe the copy: nothing else runs.
    assert set(planned_jobs(snakemake(work, config, name="copy.yaml"))) <= REPORT_JOBS
    assert planned_jobs(snakemake(work, config, "-n", name="copy.yaml")) == {}
    return work, config, copy


def test_a_rename_deleted_results_or_a_second_clone_rebuild_nothing_keyed(built, tmp_path):
    work, config, store = built
    assert planned_jobs(snakemake(work, config, "-n")) == {}
    renamed = planned_jobs(snakemake(work, dict(config, experiment="renamed"), "-n", name="renamed.yaml"))
    assert set(renamed) <= REPORT_JOBS and "report" in renamed

    shutil.move(work / "results", tmp_path / "results")
    try:
        assert set(planned_jobs(snakemake(work, config, "-n"))) <= REPORT_JOBS
    finally:
        shutil.rmtree(work / "results", ignore_errors=True)
        shutil.move(tmp_path / "results", work / "results")

    # A second checkout: its datasets are copies with new modification times, its
    # working directory differs; the store is the same absolute path.
    clone = tmp_path / "clone"
    clone.mkdir()
    sources = {name: shutil.copy(entry["path"], clone) for name, entry in config["datasets"].items()}
    prompts = shutil.copy(config["evaluate"]["prompt_sets"]["held_out"]["path"], clone)
    cloned = dict(config, logs_dir=str(clone / "logs"))
    cloned["datasets"] = {n: dict(e, path=str(sources[n])) for n, e in config["datasets"].items()}
    cloned["evaluate"] = dict(
        config["evaluate"], prompt_sets={"held_out": {"path": prompts, "format": "prompt"}}
    )
    before = store_files(store)
    assert set(planned_jobs(snakemake(clone, cloned, "-n"))) <= REPORT_JOBS
    snakemake(clone, cloned)  # the reports read model.json from another working directory
    assert (clone / "results" / "test" / "report.html").exists()
    assert store_files(store) == before  # not one store file rewritten


def test_verify_always_runs_and_fix_rebuilds_exactly_the_damage(copied, tmp_path):
    work, config, store = copied
    checkpoint = next(store.glob("train/*/ckpt-00001.pt"))
    damaged = bytearray(checkpoint.read_bytes())
    damaged[len(damaged) // 2] ^= 0x01
    checkpoint.write_bytes(bytes(damaged))
    for _ in range(2):  # a verify that succeeded once is still run, and still fails
        result = snakemake(work, config, "verify", check=False, name="copy.yaml")
        assert result.returncode != 0 and f"CORRUPT {checkpoint}" in result.stdout + result.stderr

    spaced = tmp_path / "my configs" / "copy.yaml"
    spaced.parent.mkdir()
    spaced.write_text(yaml.safe_dump(config))
    fixed = draftsmith("verify", "--configfile", str(spaced), "--fix")
    assert fixed.returncode == 1 and "quarantined" in fixed.stdout
    command = shlex.split(fixed.stdout.split("rebuild exactly these with:\n", 1)[1])
    assert command == ["snakemake", "--configfile", str(spaced), str(checkpoint)]
    args = command[1:]
    planned = planned_jobs(
        subprocess.run(snakemake_cmd(work, spaced, *args[2:], "-n"), capture_output=True, text=True)
    )
    assert planned == {"train_segment": 1}
    others = {f: s for f, s in store_files(store).items() if "-00001" not in f}
    subprocess.run(snakemake_cmd(work, spaced, *args[2:]), check=True, capture_output=True)
    assert {f: s for f, s in store_files(store).items() if "-00001" not in f} == others
    assert planned_jobs(snakemake(work, config, "-n", name="copy.yaml")) == {}
    assert draftsmith("verify", "--configfile", str(spaced)).returncode == 0


def test_a_deleted_artifact_directory_is_reported_and_rebuilt_alone(copied):
    work, config, store = copied
    tokens = next(store.glob("tokens/colours/*"))
    before = (tokens / "tokens.jsonl").read_bytes()
    shutil.rmtree(tokens)
    path = work / "copy.yaml"
    path.write_text(yaml.safe_dump(config))
    result = draftsmith("verify", "--configfile", str(path))
    assert result.returncode == 1 and f"MISSING {tokens / 'manifest.json'}" in result.stdout
    # Snakemake starts the direct consumer of a file it rebuilds; that job finds its own
    # outputs complete under the same key and keeps them.
    assert planned_jobs(snakemake(work, config, "-n", name="copy.yaml")) == {
        "tokens": 1,
        "merged": 1,
        "all": 1,
    }
    merged = {p: p.read_bytes() for p in next(store.glob("merged/*")).iterdir() if p.is_file()}
    snakemake(work, config, name="copy.yaml")
    assert (tokens / "tokens.jsonl").read_bytes() == before
    assert {p: p.read_bytes() for p in merged} == merged
    log = next((work / "logs" / "merged").glob("*.log")).read_text()
    assert "already built" in log
    assert draftsmith("verify", "--configfile", str(path)).returncode == 0
    assert planned_jobs(snakemake(work, config, "-n", name="copy.yaml")) == {}


def test_a_missing_report_html_is_rebuilt(built):
    work, config, _ = built
    snakemake(work, config)  # other tests pointed this working directory's reports elsewhere
    html = work / "results" / "test" / "report.html"
    html.unlink()
    assert planned_jobs(snakemake(work, config, "-n")) == {"report_html": 1, "all": 1}
    snakemake(work, config)
    assert html.read_text().lstrip().lower().startswith("<!doctype html")
