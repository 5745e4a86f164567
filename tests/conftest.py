"""Shared fixtures: the real demo model (converted once per session) and workflow runs."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from draftsmith.fsutil.digests import sha256_file
from draftsmith.store import manifest, verify

# Under pytest-xdist each of the workers (and the jobs its tests start) gets one torch thread:
# two workers each running two threads on two cores spend their time waiting at barriers.
if "PYTEST_XDIST_WORKER" in os.environ:
    import torch

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

REPO = Path(__file__).resolve().parents[1]
DEMO_SOURCE = yaml.safe_load((REPO / "config.yaml").read_text())["model"]["source"]
# Set by .ci/run, which installs requirements/sglang-parser.txt: there a missing parser fails.
REQUIRE_SGLANG_PARSER = "DRAFTSMITH_REQUIRE_SGLANG_PARSER"


def sglang_server_args() -> ModuleType:
    """SGLang's `sglang.srt.server_args`, whose parser the tests run on launch commands; skips
    where SGLang is not installed (the README's venv), fails where REQUIRE_SGLANG_PARSER is set."""
    try:
        return importlib.import_module("sglang.srt.server_args")
    except ImportError as exc:
        reason = f"SGLang's argument parser is not importable ({exc}): see requirements/sglang-parser.txt"
        if os.environ.get(REQUIRE_SGLANG_PARSER):
            pytest.fail(f"{REQUIRE_SGLANG_PARSER} is set: {reason}")
        pytest.skip(reason)


def demo_model_cache() -> Path:
    """Where the converted demo model is kept between sessions: converting it takes ~20 s
    (three GGUF parses in transformers), so each session after the first skips that. The
    name holds what the bytes depend on: the GGUF's sha256 and the converter's version."""
    import transformers

    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    name = f"{DEMO_SOURCE['sha256'][:16]}-float32-transformers-{transformers.__version__}"
    return cache / "draftsmith" / "test-models" / name


@pytest.fixture(scope="session")
def demo_model_dir(tmp_path_factory) -> Path:
    """SmolLM2-135M-Instruct dequantised from the pinned GGUF, as the model stage does
    (`DRAFTSMITH_TEST_MODEL_DIR` names another converted copy)."""
    import fcntl

    from draftsmith.model.settings import ModelSource
    from draftsmith.model.source import convert_gguf, fetch_gguf

    cached = Path(os.environ.get("DRAFTSMITH_TEST_MODEL_DIR") or demo_model_cache())
    if (cached / "config.json").exists():
        return cached
    cached.parent.mkdir(parents=True, exist_ok=True)
    with open(cached.parent / f"{cached.name}.lock", "w") as lock:  # parallel workers convert once
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (cached / "config.json").exists():
            work = tmp_path_factory.mktemp("demo-model")
            source = ModelSource.of(DEMO_SOURCE)
            convert_gguf(fetch_gguf(source, work), cached, "float32")  # atomic: never half a model
    return cached


@pytest.fixture(scope="session")
def built_pipeline(tmp_path_factory, demo_model_dir) -> tuple[Path, dict]:
    """(workdir, config) of one finished every-stage run of `pipeline_config` (search off),
    built once per test run under a lock and shared by every worker: tests read it, and a
    test that changes a store copies it first (`copied_pipeline`)."""
    import fcntl

    root = tmp_path_factory.getbasetemp()
    root = root.parent if "PYTEST_XDIST_WORKER" in os.environ else root  # the workers' common base
    work, done = root / "built-pipeline", root / "built-pipeline.json"
    with open(root / "built-pipeline.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            work.mkdir()
            config = pipeline_config(work, demo_model_dir, work / "store")
            snakemake(work, config)
            done.write_text(json.dumps(config))
    return work, json.loads(done.read_text())


def copied_pipeline(built: tuple[Path, dict], to: Path) -> tuple[Path, dict]:
    """A copy of the built pipeline's workdir and store at `to`, its config pointing at the copy."""
    import shutil

    work, config = built
    shutil.copytree(work, to, symlinks=True)
    return to, dict(config, artifacts_dir=str(to / Path(config["artifacts_dir"]).relative_to(work)))


def sglang_block(section: str, **overrides) -> dict:
    """`<section>.sglang` (generation, extract or serve_benchmark) with the schema's defaults."""
    from draftsmith.config import load_schema

    props = load_schema()["properties"][section]["properties"]["sglang"]["properties"]
    return {name: spec.get("default") for name, spec in props.items()} | overrides


def openai_cfg(url: str, **overrides):
    """generation.openai's settings from the schema's defaults, as config loading fills them
    in, with fast retries for the fault proxy."""
    import copy

    from draftsmith.config import load_schema
    from draftsmith.responses.settings import OpenAIGeneration

    props = load_schema()["properties"]["generation"]["properties"]["openai"]["properties"]
    cfg = {name: copy.deepcopy(spec["default"]) for name, spec in props.items()}
    cfg.update(base_url=url, backoff_s=0.01, max_backoff_s=0.05, timeout_s=5)
    cfg.update(overrides)
    return OpenAIGeneration.of(cfg)


@pytest.fixture(scope="session")
def tools_model_dir(demo_model_dir, tmp_path_factory) -> Path:
    """The demo model with the tests' tool-and-reasoning chat template (weights linked)."""
    import shutil

    directory = tmp_path_factory.mktemp("tools-model")
    for item in Path(demo_model_dir).iterdir():
        if item.suffix == ".safetensors":
            (directory / item.name).symlink_to(item)
        else:
            shutil.copy(item, directory / item.name)
    template = Path(__file__).parent / "tokens" / "templates" / "tools_reasoning.jinja"
    (directory / "chat_template.jinja").write_text(template.read_text())
    return directory


@pytest.fixture(scope="session")
def transformers_server(demo_model_dir):
    """A real `transformers serve` on loopback serving the demo model: (base_url, model name)."""
    from transformers_serve import start_transformers_serve

    from draftsmith.runtime.process import free_port

    with start_transformers_serve(demo_model_dir, free_port()) as url:
        yield url, str(demo_model_dir)


def write_rows(path: Path, prompts: list[str]) -> Path:
    import json

    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    return path


def write_training(tmp: Path, questions: dict[str, str]) -> tuple[Path, Path]:
    """A merged train.jsonl (ids only matter) and the responses.jsonl holding the prompts."""
    from draftsmith.formats.responses import Usage, response_record
    from draftsmith.fsutil import atomic

    responses = [
        response_record(
            prompt_id=sample_id,
            dataset="chat",
            index=i,
            messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": question}],
            response="ok",
            finish_reason="stop",
            usage=Usage(1, 1),
        )
        for i, (sample_id, question) in enumerate(questions.items())
    ]
    atomic.write_jsonl(tmp / "responses.jsonl", responses)
    train = [{"id": i, "dataset": "chat", "input_ids": [1], "loss_mask": [1]} for i in questions]
    atomic.write_jsonl(tmp / "train.jsonl", train)
    return tmp / "train.jsonl", tmp / "responses.jsonl"


def workflow_config(tmp: Path, model_dir: Path, datasets: dict[str, Path], **overrides) -> dict:
    """A tiny config for workflow tests: the real demo model, few short generations."""
    config = {
        "experiment": "test",
        "artifacts_dir": str(tmp / "artifacts"),
        "logs_dir": str(tmp / "logs"),
        "model": {"source": {"kind": "hf_dir", "path": str(model_dir)}, "probe_generation": False},
        "generation": {"backend": "hf", "max_new_tokens": 12, "hf": {"batch_size": 8}},
        "datasets": {name: {"path": str(p), "format": "prompt"} for name, p in datasets.items()},
        "tokenize": {"max_length": 256},
        "merge": {"seed": 0},
        "evaluate": {"enabled": False},
    }
    for key, value in overrides.items():
        config[key] = value
    return config


FACTS = [f"Tell me one short fact about the number {i}." for i in range(6)]
COLOURS = ["Name a primary colour.", "Say hi.", "Name a fruit.", "What is 2 + 2?"]
HELD_OUT = ["Name a planet.", "Count to three."]


def pipeline_config(tmp: Path, model_dir: Path, store: Path | None = None, search: bool = False) -> dict:
    """A config that runs every stage (responses to the report) in about a minute on 2 cores;
    the search (a job of its own decodes) only with `search`: one suite runs it end to end."""
    datasets = {
        "facts": write_rows(tmp / "facts.jsonl", FACTS),
        "colours": write_rows(tmp / "colours.jsonl", COLOURS),
    }
    config = workflow_config(tmp, model_dir, datasets)
    if store is not None:
        config["artifacts_dir"] = str(store)
    config["generation"]["max_new_tokens"] = 16
    config["extract"] = {"num_shards": 2, "batch_tokens": 256}
    config["train"] = {
        "draft_vocab_size": 256,
        "ttt_steps": 2,
        "warmup_steps": 1,
        "total_steps": 6,
        "checkpoint_every": 2,
        "batch_tokens": 256,
        "val_fraction": 0.2,
    }
    config["export"] = {"dtype": "float32"}
    held_out = write_rows(tmp / "held_out.jsonl", HELD_OUT)
    config["evaluate"] = {
        "k": [1, 2],
        "max_new_tokens": 8,
        "warmup_prompts": 0,
        "prompt_sets": {"held_out": {"path": str(held_out), "format": "prompt"}},
    }
    config["search"] = (
        {"num_steps": [2], "topk": [1, 2], "num_draft_tokens": [4]}  # a chain and a tree
        if search
        else {"enabled": False}
    )
    return config


def stand_in_config(tmp: Path) -> dict:
    """A raw config over a stand-in target directory (a config.json only) and two small
    prompt files: enough to plan a store, not to run it."""
    target = tmp / "target"
    target.mkdir()
    (target / "config.json").write_text("{}")
    datasets = {n: write_rows(tmp / f"{n}.jsonl", [f"{n} prompt"]) for n in ("chat", "code")}
    return workflow_config(tmp, target, datasets, extract={"num_shards": 2})


def snakemake_cmd(workdir: Path, config_path: Path, *args: str) -> list[str]:
    """The command line of a real workflow run in `workdir` with the config at `config_path`."""
    return [
        sys.executable,
        "-m",
        "snakemake",
        "-s",
        str(REPO / "Snakefile"),
        "-d",
        str(workdir),
        "--configfile",
        str(config_path),
        "--cores",
        "2",
        *args,
    ]


def snakemake(workdir: Path, config: dict, *args: str, check: bool = True, name: str = "config.yaml"):
    """Run the real workflow in `workdir` with `config`; returns the CompletedProcess."""
    config_path = workdir / name
    config_path.write_text(yaml.safe_dump(config))
    cmd = snakemake_cmd(workdir, config_path, *args)
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if check and result.returncode != 0:
        raise AssertionError(
            f"snakemake {' '.join(args)} failed:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
        )
    return result


def planned_jobs(result) -> dict[str, int]:
    """The 'Job stats' table of a dry run: rule -> job count."""
    out = result.stdout + result.stderr
    if "Nothing to be done" in out:
        return {}
    lines = out.split("Job stats:", 1)[1].splitlines()
    counts = {}
    for line in lines[3:]:
        parts = line.split()
        if len(parts) != 2 or parts[0] == "total":
            break
        counts[parts[0]] = int(parts[1])
    return counts


def finished_files(store: Path) -> dict[Path, str]:
    """sha256 of every file of every finished artifact, as the store recorded it."""
    files: dict[Path, str] = {}
    for path in verify.find_manifests(store):
        files[path] = sha256_file(path)
        if path.match(verify.SHARD_INDEX_GLOB):
            files[path.with_suffix(".bin")] = json.loads(path.read_text())["bin"]["sha256"]
        else:
            for name, entry in manifest.read(path)["files"].items():
                files[path.parent / name] = entry["sha256"]
    for record in verify.find_records(store):
        for name, entry in json.loads(record.read_text())["files"].items():
            files[record.parent.parent / name] = entry["sha256"]
    return files


def changed(files: dict[Path, str]) -> list[Path]:
    return [p for p, digest in files.items() if not p.exists() or sha256_file(p) != digest]


def built_by(works: list[Path]) -> dict[str, list[str]]:
    """Keyed job -> the checkouts (workdir names) whose job built it rather than finding it
    already built, from the rule logs."""
    who: dict[str, list[str]] = {}
    for work in works:
        for log in (work / "logs").rglob("*.log"):
            text = log.read_text()
            if "finished in" in text and "already built" not in text:
                who.setdefault(str(log.relative_to(work / "logs")), []).append(work.name)
    return {job: names for job, names in who.items() if not job.startswith(("report", "hidden_estimate"))}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Longest files first. pytest-xdist hands each file to the next free worker in this order
    (`--no-loadscope-reorder`): the chaos and Slurm suites and the users of the shared pipeline
    build, then the files with the most end-to-end test functions, so that no long file starts
    last and runs alone."""
    functions = {(i.path, i.originalname) for i in items if i.get_closest_marker("slow")}
    slow = Counter(path for path, _ in functions)
    long_files = {i.path for i in items if _long(i)}
    items.sort(key=lambda item: (item.path not in long_files, -slow[item.path]))


def _long(item: pytest.Item) -> bool:
    return bool(item.get_closest_marker("chaos") or item.get_closest_marker("slurm")) or (
        "built_pipeline" in item.fixturenames
    )


def pytest_sessionfinish(session) -> None:
    import chaos_tally

    if hasattr(session.config, "workeroutput"):  # a pytest-xdist worker: the controller prints
        session.config.workeroutput["chaos"] = chaos_tally.snapshot()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    import chaos_tally

    chaos_tally.absorb(getattr(node, "workeroutput", {}).get("chaos", {"tally": {}, "figures": {}}))


def pytest_terminal_summary(terminalreporter) -> None:
    import chaos_tally

    lines = chaos_tally.summary_lines()
    if lines:
        terminalreporter.section("chaos summary")
        for line in lines:
            terminalreporter.write_line(line)
