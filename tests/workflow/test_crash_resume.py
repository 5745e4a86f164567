"""kill -9 of Snakemake mid-generation: the job dies with it, the rerun resumes from the
answers already stored."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from conftest import REPO, snakemake_cmd, workflow_config, write_rows
from fault_proxy import FaultProxy

from draftsmith.store import answers
from draftsmith.store.layout import ANSWERS, ANSWERS_FILE

pytestmark = pytest.mark.slow

PROMPTS = [f"Write one sentence about the number {i}." for i in range(12)]


def job_pids(marker: str) -> list[int]:
    """Pids of processes whose command line contains `marker`."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if marker in cmdline and int(entry.name) != os.getpid():
                pids.append(int(entry.name))
    return pids


def wait_for(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def kill_mid_generation(workdir: Path, config: dict, env: dict | None = None) -> dict[str, dict]:
    """Start `snakemake data`, kill -9 it once 3 answers are stored; returns them by prompt id."""
    config_path = workdir / "config.yaml"
    config_path.write_text(yaml.safe_dump(config))
    cmd = snakemake_cmd(workdir, config_path, "merged")
    runner = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, env=env
    )

    ids = {answers.address([{"role": "user", "content": p}]): f"slow-{i:06d}" for i, p in enumerate(PROMPTS)}

    def journal() -> dict[str, dict]:
        found = list(workdir.glob(f"artifacts/{ANSWERS}/*/{ANSWERS_FILE}"))
        lines = found[0].read_text().splitlines() if found else []
        stored = [json.loads(line) for line in lines if line.endswith("}")]
        return {ids[a["address"]]: a for a in stored}

    try:
        wait_for(lambda: len(journal()) >= 3, 300, "three journaled responses")
        workers = job_pids("responses.py")
        assert workers, "the generation job should be running"
        os.kill(runner.pid, signal.SIGKILL)
        runner.wait()
        # The job notices its snakemake is gone and stops (no orphan holding memory).
        wait_for(lambda: not set(workers) & set(job_pids("responses.py")), 30, "the job to exit")
    finally:
        if runner.poll() is None:
            os.killpg(runner.pid, signal.SIGKILL)
    out_dir = next(workdir.glob("artifacts/responses/slow/*"))
    assert not (out_dir / "responses.jsonl").exists()  # no partial output under the final name
    done = journal()
    assert 3 <= len(done) < len(PROMPTS)
    return done


def resume(workdir: Path, config: dict, done: dict[str, dict], env: dict | None = None) -> list[dict]:
    for args in (["--unlock"], ["merged"]):
        config_path = workdir / "config.yaml"
        cmd = snakemake_cmd(workdir, config_path, *args)
        result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
        assert result.returncode == 0, result.stderr[-3000:]
    log = next((workdir / "logs" / "responses" / "slow").glob("*.log")).read_text()
    left = len(PROMPTS) - len(done)
    assert f"{len(PROMPTS)} prompts, {len(done)} already answered in the store, {left} to generate" in log
    out_dir = next(workdir.glob("artifacts/responses/slow/*"))
    records = [json.loads(line) for line in (out_dir / "responses.jsonl").read_text().splitlines()]
    assert [r["id"] for r in records] == [f"slow-{i:06d}" for i in range(len(PROMPTS))]
    for record_id, answer in done.items():  # stored answers used as they were
        record = next(r for r in records if r["id"] == record_id)
        assert record == answers.as_record(answer, record_id, "slow", int(record_id[-6:]))
    return records


def test_kill9_snakemake_then_resume_hf(tmp_path, demo_model_dir):
    config = workflow_config(tmp_path, demo_model_dir, {"slow": write_rows(tmp_path / "slow.jsonl", PROMPTS)})
    config["generation"].update(max_new_tokens=24, hf={"batch_size": 1})
    done = kill_mid_generation(tmp_path, config)
    resume(tmp_path, config, done)


def test_kill9_openai_backend_never_rerequests_finished(tmp_path, demo_model_dir, transformers_server):
    """Through a counting proxy in front of a real server; the API key never lands on disk."""
    url, served = transformers_server
    key = "sk-test-" + secrets.token_hex(16)
    env = {**os.environ, "DRAFTSMITH_TEST_API_KEY": key}
    config = workflow_config(tmp_path, demo_model_dir, {"slow": write_rows(tmp_path / "slow.jsonl", PROMPTS)})
    with FaultProxy(url) as proxy:
        proxy.script(PROMPTS[1], "500", "reset")  # retried, then answered
        config["generation"] = {
            "backend": "openai",
            "max_new_tokens": 24,
            "openai": {
                "base_url": proxy.url,
                "model": served,
                "api_key_env": "DRAFTSMITH_TEST_API_KEY",
                "concurrency": 1,
                "timeout_s": 120,
                "backoff_s": 0.2,
                "price_per_million_input": 1.0,
                "price_per_million_output": 2.0,
            },
        }
        done = kill_mid_generation(tmp_path, config, env)
        records = resume(tmp_path, config, done, env)
    index = {f"slow-{i:06d}": p for i, p in enumerate(PROMPTS)}
    for record_id in done:  # the scripted prompt took 3 requests (500, reset, answer) before it was done
        expected = 3 if index[record_id] == PROMPTS[1] else 1
        assert proxy.counts[index[record_id]] == expected, f"{record_id} was requested again"
    assert proxy.counts[PROMPTS[1]] >= 3 and set(proxy.counts) == set(PROMPTS)
    assert all(h.get("Authorization") == f"Bearer {key}" for h in proxy.headers)
    assert all(r["usage"]["completion_tokens"] > 0 for r in records)
    leaks = [p for p in tmp_path.rglob("*") if p.is_file() and key.encode() in p.read_bytes()]
    leaks += [p for p in (REPO / ".snakemake").rglob("*") if p.is_file() and key.encode() in p.read_bytes()]
    assert leaks == []
