"""A job runs only while the snakemake that started it lives: one whose snakemake was
killed before the job began refuses to start (nothing else would ever stop it), and one
whose snakemake dies mid-run is interrupted by the watchdog."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from runtime.test_process import survivors

# The job: wait for the go-ahead file (so the test can kill the parent first), then run
# a body of up to 60 s inside `jobs.job`, writing what it got to.
CHILD = r"""
import sys, time
from pathlib import Path

from draftsmith.runtime.jobs import job

go, log, done = (Path(a) for a in sys.argv[1:4])
while not go.exists():
    time.sleep(0.05)
with job(log, "rule test"):
    for _ in range(600):
        if Path(sys.argv[4]).exists():
            break
        time.sleep(0.1)
    done.write_text("finished")
"""

# Stands in for snakemake: the marker in its command line is what the job looks for.
PARENT = r"""
import subprocess, sys

child = subprocess.Popen([sys.executable, "-c", sys.argv[1], *sys.argv[2:6]])
print(child.pid, flush=True)
if sys.argv[6] == "wait":
    child.wait()
"""


def start(tmp: Path, parent_mode: str) -> tuple[subprocess.Popen, int, dict[str, Path]]:
    paths = {name: tmp / name for name in ("go", "job.log", "done", "stop")}
    args = [str(paths[n]) for n in ("go", "job.log", "done", "stop")]
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, CHILD, *args, parent_mode, "snakemake-stand-in"],
        stdout=subprocess.PIPE,
        text=True,
    )
    child_pid = int(parent.stdout.readline())
    return parent, child_pid, paths


def test_a_job_runs_to_the_end_under_its_snakemake(tmp_path):
    parent, _, paths = start(tmp_path, "wait")
    paths["stop"].touch()
    paths["go"].touch()
    assert parent.wait(timeout=60) == 0
    assert paths["done"].read_text() == "finished"
    assert "rule test: finished" in paths["job.log"].read_text()


def test_a_job_whose_snakemake_died_before_it_began_does_not_start(tmp_path):
    parent, child, paths = start(tmp_path, "exit")
    assert parent.wait(timeout=30) == 0  # the stand-in exits: the job is orphaned
    paths["go"].touch()
    assert not survivors([child], wait_s=30), "the orphaned job kept running"
    assert not paths["done"].exists()
    assert "the snakemake that started this job is gone: not starting" in paths["job.log"].read_text()


def test_a_job_whose_snakemake_dies_mid_run_is_interrupted(tmp_path):
    parent, child, paths = start(tmp_path, "wait")
    paths["go"].touch()
    log = paths["job.log"]
    deadline = time.monotonic() + 60
    while not (log.exists() and "started" in log.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    parent.kill()
    parent.wait()
    assert not survivors([child], wait_s=30), "the job outlived its snakemake"
    assert not paths["done"].exists()
    assert "rule test: interrupted after" in log.read_text()
