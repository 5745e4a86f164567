"""Chaos: kill -9 at random points of the real workflow, thirty times; no finished artifact
is lost or changed, no journaled paid answer is requested again, and the rerun completes
and verifies. The tally is printed at the end of the run (tests/chaos/conftest.py)."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from chaos_runs import SEED, draftsmith, run, write
from conftest import changed, finished_files, pipeline_config, snakemake_cmd
from fault_proxy import FaultProxy, last_user_message

from draftsmith.store.layout import ANSWERS, ANSWERS_FILE

pytestmark = [pytest.mark.slow, pytest.mark.chaos]

KILLS = 30
# The job scripts in an order a run reaches them. Every stage listed after a kill target
# depends on it, so a job of a later stage means the target is done. vocab needs only the
# split (hidden_assign) and runs beside the shards: listed after hidden_shard, a vocab job
# passed for "shards done" and every kill aimed at the shards missed.
# Kills cycle through the targets.
STAGE_ORDER = (
    "model", "responses", "tokens", "merged", "hidden_assign", "vocab", "hidden_estimate",
    "hidden_shard", "train_segment", "train", "export", "evaluate", "report",
)  # fmt: skip
KILL_TARGETS = ("responses", "tokens", "hidden_shard", "train_segment", "export", "evaluate")
JOB_SCRIPT = re.compile(r"\.snakemake/scripts/tmp\w+\.(\w+)\.py")


def running_jobs(work: Path) -> dict[int, str]:
    """pid -> rule of the job processes started from `work`."""
    jobs = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        match = JOB_SCRIPT.search(cmdline)
        if match and str(work) in cmdline:
            jobs[int(proc.name)] = match.group(1)
    return jobs


def reached(proc: subprocess.Popen, work: Path, stage: str, timeout_s: float = 600) -> bool:
    """Wait until a job of `stage` or of a later one runs (True) or snakemake exits (False)."""
    rank = STAGE_ORDER.index(stage)
    deadline = time.monotonic() + timeout_s
    while proc.poll() is None and time.monotonic() < deadline:
        if any(STAGE_ORDER.index(s) >= rank for s in running_jobs(work).values() if s in STAGE_ORDER):
            return True
        time.sleep(0.1)
    assert proc.poll() is not None, f"no job of {stage} or later within {timeout_s} s"
    return False


def wait_gone(work: Path, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while running_jobs(work) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not running_jobs(work), f"jobs outlived their snakemake: {running_jobs(work)}"


def journaled_prompts(store: Path) -> set[str]:
    """The user prompts of every stored answer (torn last lines skipped)."""
    prompts = set()
    for journal in store.glob(f"{ANSWERS}/*/{ANSWERS_FILE}"):
        for line in journal.read_text().splitlines():
            try:
                prompts.add(last_user_message(json.loads(line)))
            except json.JSONDecodeError:
                continue
    return prompts


def test_kill9_at_random_points(tmp_path, demo_model_dir, transformers_server, tally):
    """Kill snakemake (or its whole process group) at a seeded random time into a stage until
    KILLS kills: kill i waits for a job of KILL_TARGETS[i % len] (or of a later stage, once
    that one is done) and kills within a few seconds of it, so kills reach every stage
    whatever the machine's speed. A run that finishes first starts a new round with a new
    merge seed. The `facts` dataset is generated through a counting proxy in front of a
    real OpenAI-compatible server: a paid answer once journaled is never requested again.
    An answer the proxy sent but the killed client had not yet journaled is lost in flight
    (no client can avoid that window); it may be requested again and is counted apart."""
    rng = random.Random(SEED)
    url, served = transformers_server
    work, store = tmp_path / "work", tmp_path / "store"
    work.mkdir()
    config = pipeline_config(work, demo_model_dir, store)
    with FaultProxy(url) as proxy:
        config["generation"]["openai"] = {
            "base_url": proxy.url,
            "model": served,
            "api_key_env": "DRAFTSMITH_CHAOS_KEY",
            "concurrency": 2,
            "timeout_s": 120,
            "backoff_s": 0.2,
        }
        config["datasets"]["facts"]["generation"] = {"backend": "openai"}
        env = {**os.environ, "DRAFTSMITH_CHAOS_KEY": "sk-chaos"}
        kills, rounds, lost, stages = 0, 0, 0, set()
        in_flight: dict[str, int] = {}  # prompt -> answers delivered but lost at a kill
        while kills < KILLS:
            path = write(dict(config, merge={"seed": rounds}), work / "config.yaml")
            before = finished_files(store) if store.exists() else {}
            run(work, path, "--unlock")
            proc = subprocess.Popen(
                snakemake_cmd(work, path), env=env, start_new_session=True,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            target = KILL_TARGETS[kills % len(KILL_TARGETS)]
            if reached(proc, work, target):
                time.sleep(rng.uniform(0, 3))
            if proc.poll() is not None:
                assert proc.returncode == 0
                rounds += 1  # finished before the kill: the next round retrains
                continue
            stages.update(running_jobs(work).values())
            whole_group = rng.random() < 0.5
            os.killpg(proc.pid, signal.SIGKILL) if whole_group else proc.kill()
            proc.wait()
            kills += 1
            wait_gone(work)
            journaled = journaled_prompts(store)
            for prompt, count in proxy.delivered.items():
                if prompt not in journaled:
                    in_flight[prompt] = count
            damaged = changed(before)
            lost += len(damaged)
            tally.case("kill -9", not damaged)
        run(work, path, "--unlock")
        run(work, path, env=env)
    tally.add("kills tried", kills)
    tally.add("finished artifacts lost or changed", lost)
    tally.add("rules running at a kill", len(stages))
    duplicates = sum(max(0, n - 1 - in_flight.get(p, 0)) for p, n in proxy.delivered.items())
    tally.add("answers lost in flight at a kill", sum(in_flight.values()))
    tally.add("journaled answers requested again", duplicates)
    assert lost == 0 and duplicates == 0
    assert {"responses", "hidden_shard", "train_segment"} <= stages, stages
    assert draftsmith("verify", "--configfile", str(path)).returncode == 0
    for journal in store.glob(f"{ANSWERS}/*/{ANSWERS_FILE}"):
        stored = [json.loads(line)["address"] for line in journal.read_text().splitlines()]
        assert len(stored) == len(set(stored))
    assert not list(store.rglob(".tmp-*")), "a dead process's temporaries were left behind"
