"""Chaos: damaged files, a full disk, bad inputs, two checkouts
at once, gc looping during another config's run and a read-only store, each on the real
workflow. Every case asserts that no finished artifact is lost or changed, that the rerun
completes and that the store verifies; the tally is printed at the end of the run
(tests/chaos/conftest.py).

Kills at random points are tests/chaos/test_kill9.py, a file of its own so that it runs
beside this one. Seeded: DRAFTSMITH_CHAOS_SEED (chaos_runs.py) picks the damage.
"""

from __future__ import annotations

import json
import os
import random
import re
import secrets
import shlex
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest
import yaml
from chaos_runs import SEED, draftsmith, run, write
from conftest import (
    COLOURS,
    FACTS,
    built_by,
    changed,
    copied_pipeline,
    finished_files,
    pipeline_config,
    planned_jobs,
    snakemake_cmd,
    workflow_config,
    write_rows,
)
from fault_proxy import FaultProxy

from draftsmith.runtime.process import free_port
from draftsmith.store.layout import ANSWERS, ANSWERS_FILE

pytestmark = [pytest.mark.slow, pytest.mark.chaos]

DAMAGE_CASES = 8


@pytest.fixture(scope="module")
def reference(tmp_path_factory, built_pipeline):
    """A finished run of every stage, this module's copy: what damaged stores are repaired back to."""
    return copied_pipeline(built_pipeline, tmp_path_factory.mktemp("reference") / "work")


# --- damage -------------------------------------------------------------------------------
def damage(path: Path, kind: str, rng: random.Random) -> None:
    if kind == "flip":
        data = bytearray(path.read_bytes())
        data[rng.randrange(len(data))] ^= 0xFF
        path.write_bytes(bytes(data))
    elif kind == "truncate":
        with open(path, "r+b") as handle:
            handle.truncate(path.stat().st_size // 2)
    elif kind == "delete_file":
        path.unlink()
    else:
        shutil.rmtree(artifact_dir(path))


def artifact_dir(path: Path) -> Path:
    """The key directory a store file belongs to."""
    return next(p for p in [path, *path.parents] if re.fullmatch(r"[0-9a-f]{16}", p.name))


def test_damaged_files_are_found_and_rebuilt_exactly(reference, tmp_path, tally):
    work, config = reference
    rng = random.Random(SEED)
    original = finished_files(Path(config["artifacts_dir"]))
    relative = sorted(str(p.relative_to(config["artifacts_dir"])) for p in original if p.stat().st_size)
    for case in range(DAMAGE_CASES):
        store = tmp_path / f"store-{case}"
        shutil.copytree(config["artifacts_dir"], store)
        copy = dict(config, artifacts_dir=str(store))
        path = write(copy, tmp_path / f"copy {case}.yaml")
        run(work, path)  # this working directory's reports now describe the copy
        target = store / rng.choice(relative)
        kind = rng.choice(["flip", "truncate", "delete_file", "delete_dir"])
        untouched = {
            p: d for p, d in finished_files(store).items() if artifact_dir(p) != artifact_dir(target)
        }
        damage(target, kind, rng)
        found = draftsmith("verify", "--configfile", str(path), "--fix")
        named = found.returncode == 1 and str(artifact_dir(target)) in found.stdout
        command = shlex.split(found.stdout.split("rebuild exactly these with:\n", 1)[1])
        run(work, path, *command[3:])
        repaired = planned_jobs(run(work, path, "-n")) == {}
        verified = draftsmith("verify", "--configfile", str(path)).returncode == 0
        kept = not changed(untouched)
        passed = named and repaired and verified and kept
        tally.case("damaged file", passed)
        assert passed, (kind, target, found.stdout, named, repaired, verified, kept)
        shutil.rmtree(store)


# --- a full disk --------------------------------------------------------------------------
def test_a_full_disk_fails_clearly_and_the_rerun_completes(tmp_path, demo_model_dir, tally):
    disk = tmp_path / "disk"
    disk.mkdir()
    mount = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=40m", "tmpfs", str(disk)], capture_output=True
    )
    if mount.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mount.stderr.decode().strip()}")
    try:
        config = pipeline_config(tmp_path, demo_model_dir, disk / "store")
        path = write(config, tmp_path / "config.yaml")
        failed = run(tmp_path, path, check=False)
        logs = "".join(p.read_text() for p in (tmp_path / "logs").rglob("*.log"))
        clear = failed.returncode != 0 and re.search(rf"disk full at {re.escape(str(disk))}/store/\S+", logs)
        before = finished_files(disk / "store")
        corrupt = "CORRUPT" in draftsmith("verify", "--configfile", str(path)).stdout
        subprocess.run(["mount", "-o", "remount,size=1g", str(disk)], check=True)
        run(tmp_path, path)
        passed = bool(clear) and not corrupt and not changed(before)
        passed &= draftsmith("verify", "--configfile", str(path)).returncode == 0
        tally.case("full disk", passed)
        assert passed, (clear, corrupt, failed.stdout[-2000:])
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


# --- bad inputs -------------------------------------------------------------------------
BAD_INPUTS = {
    "unknown key": (lambda c: c.update(trian={}), "trian"),
    "unknown device": (lambda c: c["generation"]["hf"].update(device="tpu"), "generation.hf.device"),
    "no prompt sets": (lambda c: c["evaluate"].update(prompt_sets={}), "evaluate.prompt_sets: empty"),
    "warmup past the end": (lambda c: c["train"].update(warmup_steps=99), "train.warmup_steps (99)"),
    "wrong type": (lambda c: c["train"].update(total_steps="six"), "train.total_steps"),
    "unknown format": (lambda c: c["datasets"]["facts"].update(format="csv"), "datasets.facts.format"),
    "unknown merge cap": (lambda c: c["merge"].update(caps={"nope": 3}), "merge.caps: unknown dataset"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_inputs_fail_before_any_work_with_a_clear_error(case, tmp_path, demo_model_dir, tally):
    config = pipeline_config(tmp_path, demo_model_dir)
    mutate, expected = BAD_INPUTS[case]
    mutate(config)
    result = run(tmp_path, write(config, tmp_path / "config.yaml"), check=False)
    clear = result.returncode != 0 and expected in result.stdout + result.stderr
    no_work = not list((tmp_path / "artifacts").rglob("manifest.json"))
    tally.case("bad input", clear and no_work)
    tally.add("bad inputs tried")
    tally.add("clear errors", int(clear))
    assert clear and no_work, result.stderr[-2000:]


# --- the API key in failing runs ---------------------------------------------------------
def produced_text(work: Path, *outputs: str) -> bytes:
    """Every file under `work` (store, job logs, .snakemake/log, benchmarks), and `outputs`."""
    files = (p.read_bytes() for p in work.rglob("*") if p.is_file() and not p.is_symlink())
    return b"\n".join([*files, *(o.encode() for o in outputs)])


def test_the_api_key_never_reaches_a_file_or_log(tmp_path, demo_model_dir, tally):
    """Runs that fail each way a key can be printed: a key with a carriage return (copied
    from a CRLF file), a server that refuses the request and one that keeps failing (both
    echoing the Authorization header back), a dead server. Afterwards no file, log or
    terminal output holds any key's body, escaped or not."""
    work = tmp_path / "work"
    work.mkdir()
    config = workflow_config(work, demo_model_dir, {"facts": write_rows(work / "facts.jsonl", FACTS)})
    config["generation"]["backend"] = "openai"
    dead = f"http://127.0.0.1:{free_port()}/v1"
    cases = {  # name: (key suffix, proxy script, base_url or None for the proxy, expected in the log)
        "key ending in \\r": ("\r", None, None, "holds a carriage return"),
        "server refuses": ("", "400", None, "rejected the request"),
        "server keeps failing": ("", "500", None, "gave up after 1 retries"),
        "dead server": ("", None, dead, "connection error"),
    }
    bodies, outputs = [], []
    for name, (suffix, fault, url, expected) in cases.items():
        body = "sk-chaos-" + secrets.token_hex(16)
        bodies.append(body)
        with FaultProxy(echo_auth=True) as proxy:
            if fault:
                proxy.script("*", fault, fault)
            config["generation"]["openai"] = {
                "base_url": url or proxy.url,
                "api_key_env": "DRAFTSMITH_CHAOS_KEY",
                "max_retries": 1,
                "backoff_s": 0.01,
                "timeout_s": 5,
            }
            env = {**os.environ, "DRAFTSMITH_CHAOS_KEY": body + suffix}
            result = run(work, write(config, work / "config.yaml"), "merged", check=False, env=env)
        outputs += [result.stdout, result.stderr]
        logs = b"".join(p.read_bytes() for p in (work / "logs").rglob("*.log")).decode()
        failed = result.returncode != 0 and expected in logs
        unsent = not suffix or proxy.total == 0  # a bad key is refused before any request
        tally.case("API key in a failing run", failed and unsent)
        assert failed and unsent, (name, result.stderr[-3000:])
    assert b"[REDACTED]" in produced_text(work)  # the echoed keys were there, redacted
    everything = produced_text(work, *outputs)
    leaks = [body for body in bodies if body.encode() in everything or body[9:].encode() in everything]
    tally.add("API keys found in files or logs", len(leaks))
    assert not leaks


# --- shared stores --------------------------------------------------------------------------
def test_two_checkouts_on_an_empty_store_both_finish_and_build_once(tmp_path, demo_model_dir, tally):
    store = tmp_path / "store"
    runs, works = [], [tmp_path / "first", tmp_path / "second"]
    for work in works:
        work.mkdir()
        path = write(pipeline_config(work, demo_model_dir, store), work / "config.yaml")
        runs.append(
            subprocess.Popen(snakemake_cmd(work, path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        )
    outputs = [run.communicate(timeout=900)[0].decode() for run in runs]
    finished = all(r.returncode == 0 for r in runs)
    journals_once = True
    for journal in store.glob(f"{ANSWERS}/*/{ANSWERS_FILE}"):
        stored = [json.loads(line)["address"] for line in journal.read_text().splitlines()]
        journals_once &= len(stored) == len(set(stored)) > 0
    keyed = built_by(works)
    once = bool(keyed) and all(len(who) == 1 for who in keyed.values())
    verified = draftsmith("verify", "--configfile", str(works[0] / "config.yaml")).returncode == 0
    passed = finished and journals_once and once and verified
    tally.case("two checkouts, one store", passed)
    assert passed, (finished, journals_once, keyed, outputs[0][-2000:], outputs[1][-2000:])


def test_gc_of_another_config_during_a_run_deletes_none_of_its_work(reference, tmp_path, tally):
    """`draftsmith gc --delete` for config A, looped while config C (A with other evaluate
    settings) builds its evaluation on a copy of A's store: gc leaves C's live directory (its lock
    is held, then it was just written), C's run finishes and verifies, A loses nothing."""
    _, config = reference
    store, work = tmp_path / "store", tmp_path / "work"
    shutil.copytree(config["artifacts_dir"], store)
    work.mkdir()
    first = write(dict(config, artifacts_dir=str(store)), tmp_path / "a.yaml")
    other = dict(config, artifacts_dir=str(store), evaluate={**config["evaluate"], "k": [1]})
    second = write(other, tmp_path / "c.yaml")
    before = finished_files(store)
    outputs: list[str] = []
    command = snakemake_cmd(work, second, "evaluate")
    running = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    def collect() -> None:
        while running.poll() is None:
            outputs.append(draftsmith("gc", "--delete", "--configfile", str(first)).stdout)
            time.sleep(0.5)  # leave the run most of the two cores
        outputs.append(draftsmith("gc", "--delete", "--configfile", str(first)).stdout)  # just after

    looping = threading.Thread(target=collect)
    looping.start()
    log = running.communicate(timeout=900)[0].decode()
    looping.join()
    skipped = [line for out in outputs for line in out.splitlines() if line.startswith("skipped")]
    finished = running.returncode == 0
    # Every gc ran, deleted nothing (A's store holds only A's and C's work) and named C's
    # evaluation as what it skipped.
    spared = all("gc: 0 directories deleted" in out for out in outputs)
    spared &= any(f"{store.resolve()}/evaluate/" in line for line in skipped)
    verified = draftsmith("verify", "--configfile", str(second)).returncode == 0
    kept = not changed(before)
    passed = finished and spared and verified and kept
    tally.case("gc during another run", passed)
    tally.add("gc runs during another run", len(outputs))
    tally.add("gc skips: a job held the directory", sum("in use" in line for line in skipped))
    tally.add("gc skips: written within the grace period", sum("grace" in line for line in skipped))
    assert passed, (finished, skipped, verified, kept, log[-3000:])


def test_a_dataset_edited_after_planning_is_refused_and_nothing_is_written(tmp_path, demo_model_dir, tally):
    """The dataset is replaced while the model job runs, after Snakemake keyed its responses
    by the old content: the responses job refuses (naming the change), nothing lands under
    the old key or the new one, and with the old content back the run builds it exactly."""
    from draftsmith import config as cfg
    from draftsmith.fsutil import atomic
    from draftsmith.store.plan import plan_for

    work = tmp_path / "work"
    work.mkdir()
    data = write_rows(tmp_path / "d.jsonl", FACTS)
    config = workflow_config(tmp_path, demo_model_dir, {"d": data})
    path = write(config, tmp_path / "c.yaml")
    old = plan_for(cfg.validate(yaml.safe_load(path.read_text()))).responses["d"]
    running = subprocess.Popen(
        snakemake_cmd(work, path, "merged"), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines = []
    for line in running.stdout:
        lines.append(line)
        if re.match(r"(local)?rule model:", line):
            write_rows(data, COLOURS)  # the DAG is built: responses are keyed by FACTS
            break
    lines.append(running.communicate(timeout=600)[0])
    logs = "".join(p.read_text() for p in (tmp_path / "logs").rglob("*.log"))
    new = plan_for(cfg.validate(yaml.safe_load(path.read_text()))).responses["d"]
    written = [
        p for key in (old, new) if key.directory.exists() for p in key.directory.rglob("*") if p.is_file()
    ]
    refused = running.returncode != 0 and "changed after this job was planned" in "".join(lines) + logs
    write_rows(data, FACTS)
    run(work, path, "merged")
    rebuilt = [r["messages"][-1]["content"] for r in atomic.read_jsonl(old.path("responses"))]
    passed = refused and not written and rebuilt == FACTS
    tally.case("dataset edited after planning", passed)
    assert passed, (refused, written, rebuilt, "".join(lines)[-3000:])


def test_a_read_only_store_is_planned_and_verified(reference, tmp_path, tally):
    work, config = reference
    mount = tmp_path / "read-only"
    mount.mkdir()
    bound = subprocess.run(
        ["mount", "--bind", config["artifacts_dir"], str(mount)], capture_output=True, text=True
    )
    if bound.returncode != 0:
        pytest.skip(f"cannot bind-mount here: {bound.stderr.strip()}")
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(mount)], check=True)
        path = write(dict(config, artifacts_dir=str(mount)), tmp_path / "ro.yaml")
        planned = planned_jobs(run(work, path, "-n"))
        verified = draftsmith("verify", "--configfile", str(path)).returncode == 0
        passed = set(planned) <= {"hidden_estimate", "report", "report_html", "all"} and verified
        tally.case("read-only store", passed)
        assert passed, planned
    finally:
        subprocess.run(["umount", str(mount)], check=True)
