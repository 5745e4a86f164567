"""ManagedServer against a real process tree: a server that forks two workers.

No mocks: every test starts real processes and checks, by pid, that none of
them is left running afterwards (zombies count as gone: they hold no memory).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from draftsmith.errors import ServerError
from draftsmith.runtime.process import ManagedServer, free_port, redact

# A stand-in server: forks two sleeping workers, records all pids, then serves
# /health after --delay (or exits with --exit-code instead).
FAKE_SERVER = r"""
import argparse, http.server, json, os, signal, sys, time

parser = argparse.ArgumentParser()
parser.add_argument("--port", type=int, required=True)
parser.add_argument("--pids", required=True)
parser.add_argument("--delay", type=float, default=0.0)
parser.add_argument("--exit-code", type=int)
parser.add_argument("--ignore-term", action="store_true")
args = parser.parse_args()

if args.ignore_term:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # inherited by the workers
workers = []
for _ in range(2):
    pid = os.fork()
    if pid == 0:
        time.sleep(600)
        os._exit(0)
    workers.append(pid)
with open(args.pids + ".tmp", "w") as f:
    json.dump({"server": os.getpid(), "workers": workers}, f)
os.replace(args.pids + ".tmp", args.pids)
print("fake server: workers", workers, flush=True)
if args.exit_code is not None:
    print("fake server: failing on purpose", flush=True)
    sys.exit(args.exit_code)
time.sleep(args.delay)


class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args):
        pass


http.server.HTTPServer(("127.0.0.1", args.port), Health).serve_forever()
"""

# A job process: the draftsmith signal handlers plus one ManagedServer.
JOB = r"""
import json, os, sys, time
from pathlib import Path

from draftsmith.runtime.jobs import install_signal_handlers
from draftsmith.runtime.process import ManagedServer

cmd, url, ready, mode = json.loads(sys.argv[1]), sys.argv[2], Path(sys.argv[3]), sys.argv[4]
install_signal_handlers()
server = ManagedServer(cmd, url, startup_timeout_s=60, name="fake", stop_timeout_s=2)


def announce():
    Path(f"{ready}.tmp").write_text(str(server.pid))
    os.replace(f"{ready}.tmp", ready)


if mode == "atexit":  # never leaves a with block: only the atexit fallback stops it
    server.__enter__()
    announce()
    sys.stdin.read()  # the test closes our stdin when it has seen the tree
    sys.exit(0)
with server:
    announce()
    time.sleep(600)
"""


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def survivors(pids: list[int], wait_s: float = 0.0) -> list[int]:
    deadline = time.monotonic() + wait_s
    while True:
        left = [pid for pid in pids if alive(pid)]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.1)


def wait_for(path: Path, timeout_s: float = 30.0) -> str:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)
    return path.read_text()


@dataclass
class Fake:
    cmd: list[str]
    url: str
    pids_file: Path

    def tree(self, guard_pid: int | None) -> list[int]:
        """Guard, server and worker pids (the server writes its part before serving)."""
        data = json.loads(wait_for(self.pids_file))
        return [pid for pid in (guard_pid, data["server"], *data["workers"]) if pid]


@pytest.fixture
def fake(tmp_path):
    script = tmp_path / "fake_server.py"
    script.write_text(FAKE_SERVER)
    started: list[Fake] = []

    def make(*extra: str) -> Fake:
        port = free_port()
        pids = tmp_path / f"pids-{port}.json"
        cmd = [sys.executable, str(script), "--port", str(port), "--pids", str(pids), *extra]
        started.append(Fake(cmd, f"http://127.0.0.1:{port}/health", pids))
        return started[-1]

    yield make
    for f in started:  # never leave strays behind, even when a test fails
        if f.pids_file.exists():
            for pid in f.tree(None):
                if alive(pid):
                    os.kill(pid, signal.SIGKILL)


def server(f: Fake, **kw) -> ManagedServer:
    kw.setdefault("startup_timeout_s", 30)
    return ManagedServer(f.cmd, f.url, name="fake", **kw)


def test_health_wait_then_normal_exit_stops_the_tree(fake):
    f = fake("--delay", "1")
    with server(f) as s:
        assert httpx.get(f.url, trust_env=False).status_code == 200
        pids = f.tree(s.pid)
        assert survivors(pids) == pids
        assert {os.getpgid(pid) for pid in pids[1:]} == {s.pid}
    assert survivors(pids) == []
    s.stop()  # idempotent
    s.__exit__(None, None, None)


def test_exception_in_block_stops_the_tree(fake):
    f = fake()
    with pytest.raises(KeyError), server(f) as s:
        pids = f.tree(s.pid)
        raise KeyError("boom")
    assert survivors(pids) == []


def test_early_exit_raises_with_log_tail(fake, tmp_path):
    f = fake("--exit-code", "3")
    log_path = tmp_path / "logs" / "server.log"
    log_path.parent.mkdir()
    log_path.write_text("an earlier run\n")
    s = server(f, log_path=log_path)
    with pytest.raises(ServerError) as err:
        s.__enter__()
    message = str(err.value)
    assert "fake exited with code 3" in message
    assert "failing on purpose" in message and str(log_path) in message
    assert "an earlier run" not in message
    assert survivors(f.tree(s.pid)) == []  # the orphaned workers too


def test_startup_timeout_raises_and_stops_the_tree(fake):
    f = fake("--delay", "600")
    s = server(f, startup_timeout_s=2)
    started = time.monotonic()
    with pytest.raises(ServerError, match="did not answer .* within 2 s"):
        s.__enter__()
    assert time.monotonic() - started < 15
    assert survivors(f.tree(s.pid)) == []


def test_sigterm_ignored_means_sigkill_after_stop_timeout(fake):
    f = fake("--ignore-term")
    with server(f, stop_timeout_s=1) as s:
        pids = f.tree(s.pid)
        started = time.monotonic()
    elapsed = time.monotonic() - started
    assert survivors(pids) == []
    assert 1 <= elapsed < 10


def test_server_crash_leaves_no_orphaned_workers(fake):
    # Zombie workers holding GPU memory: the guard reaps and kills them at once.
    f = fake()
    with server(f) as s:
        guard, srv, *workers = f.tree(s.pid)
        os.kill(srv, signal.SIGKILL)
        assert survivors([guard, *workers], wait_s=10) == []
    assert survivors([guard, srv, *workers]) == []


def test_refuses_a_port_that_already_answers(fake):
    first, second = fake(), fake()
    with server(first):
        taken = ManagedServer(second.cmd, first.url, startup_timeout_s=30, name="second")
        with pytest.raises(ServerError, match="already answers"), taken:
            pass
        assert httpx.get(first.url, trust_env=False).status_code == 200
    assert not second.pids_file.exists()  # never started


@pytest.mark.parametrize(
    ("mode", "expected_rc"),
    [("SIGTERM", 128 + signal.SIGTERM), ("SIGINT", 128 + signal.SIGINT), ("atexit", 0)],
)
def test_job_exit_stops_the_tree_before_the_job_ends(fake, tmp_path, mode, expected_rc):
    f = fake()
    job, pids = _start_job(f, tmp_path, mode)
    if mode == "atexit":
        job.stdin.close()
    else:
        os.kill(job.pid, getattr(signal, mode))
    assert job.wait(timeout=30) == expected_rc, (tmp_path / "job.log").read_text()
    assert survivors(pids) == [], (tmp_path / "job.log").read_text()


def test_second_signal_during_teardown_does_not_cut_it_short(fake, tmp_path):
    f = fake("--ignore-term")  # teardown takes stop_timeout_s (2 s), then SIGKILL
    job, pids = _start_job(f, tmp_path, "with")
    os.kill(job.pid, signal.SIGTERM)
    time.sleep(0.5)
    os.kill(job.pid, signal.SIGINT)
    assert job.wait(timeout=30) in (128 + signal.SIGTERM, 128 + signal.SIGINT)
    assert survivors(pids) == [], (tmp_path / "job.log").read_text()


def test_kill_9_of_the_job_stops_the_tree(fake, tmp_path):
    f = fake()
    job, pids = _start_job(f, tmp_path, "kill")
    job.kill()
    assert job.wait(timeout=30) == -signal.SIGKILL
    assert survivors(pids, wait_s=20) == []


def _start_job(f: Fake, tmp_path: Path, mode: str) -> tuple[subprocess.Popen, list[int]]:
    script, ready = tmp_path / "job.py", tmp_path / "ready"
    script.write_text(JOB)
    with open(tmp_path / "job.log", "wb") as out:
        job = subprocess.Popen(
            [sys.executable, str(script), json.dumps(f.cmd), f.url, str(ready), mode],
            stdin=subprocess.PIPE,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        pids = f.tree(int(wait_for(ready)))
    except BaseException:
        job.kill()
        job.wait()
        raise
    assert survivors(pids) == pids
    return job, pids


def test_logged_commands_hide_secret_values():
    cmd = ["srv", "--api-key", "s3", "--hf-token=s4", "--tokenizer-path", "/t", "--max-total-tokens", "9"]
    assert redact(cmd) == [
        "srv", "--api-key", "***", "--hf-token=***", "--tokenizer-path", "/t",
        "--max-total-tokens", "9",
    ]  # fmt: skip
