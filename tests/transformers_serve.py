"""Start a real `transformers serve` on loopback for slow tests.

A plain context manager (not a fixture) so any fixture can reuse it. The server
runs in its own process group, and the whole group is killed on exit, whatever
happened inside.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

STOP_GRACE_S = 15


def _executable() -> str:
    beside = Path(sys.executable).with_name("transformers")
    found = str(beside) if beside.is_file() else shutil.which("transformers")
    if not found:
        raise RuntimeError("the `transformers` CLI is not installed (pip install 'transformers[serving]')")
    return found


def serve_command(model_dir: Path | str, port: int) -> list[str]:
    # The positional FORCE_MODEL preloads the model before the port opens and
    # pins every request to it (a request must name it as `model`).
    return [
        _executable(),
        "serve",
        str(model_dir),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--device",
        "cpu",
    ]


@contextlib.contextmanager
def start_transformers_serve(
    model_dir: Path | str, port: int, *, startup_timeout_s: float = 300
) -> Iterator[str]:
    """Serve `model_dir` on 127.0.0.1:`port`; yields the OpenAI base URL (`.../v1`)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}  # a local directory needs no network
    # One intra-op thread: on a small shared box, 2 OpenMP threads competing with
    # other jobs made a 16-token reply take ~28 s instead of ~1 s.
    env.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.NamedTemporaryFile(prefix="transformers-serve-", suffix=".log") as log:
        proc = subprocess.Popen(
            serve_command(model_dir, port),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
        try:
            _wait_ready(proc, f"http://127.0.0.1:{port}/health", startup_timeout_s, log.name)
            yield f"http://127.0.0.1:{port}/v1"
        finally:
            _kill_group(proc)


def _wait_ready(proc: subprocess.Popen, health_url: str, timeout_s: float, log: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"transformers serve exited with {proc.returncode}:\n{_tail(log)}")
        with contextlib.suppress(OSError), urllib.request.urlopen(health_url, timeout=2) as reply:
            if reply.status == 200:
                return
        time.sleep(0.2)
    raise RuntimeError(f"transformers serve not ready after {timeout_s}s:\n{_tail(log)}")


def _kill_group(proc: subprocess.Popen) -> None:
    # start_new_session made the server its group's leader: pgid == pid.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=STOP_GRACE_S)
    # Also reaps any worker the server forked that outlived it.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _tail(path: str, chars: int = 3000) -> str:
    return Path(path).read_text(errors="replace")[-chars:]
