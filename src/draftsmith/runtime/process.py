"""Servers a job starts, and the guarantee that they stop with it.

Every server (SGLang for generation, hidden-state extraction, benchmarks) runs
inside a `ManagedServer`. Servers that outlived their step kept GPU memory
(zombie workers), so teardown covers the server's whole process tree:

- The direct child is `python -m draftsmith.runtime.process_guard`, started with
  `start_new_session=True`, so it leads a fresh process group; the server and
  every worker it forks stay in that group.
- Leaving the `with` block (normally, on an exception, or on `Interrupted` from
  SIGTERM/SIGINT) sends SIGTERM to the group, SIGKILL after `stop_timeout_s`,
  and waits until no running process of the group is left.
- A registry of live servers plus an `atexit` hook tears down servers whose
  `with` block never ran its exit (e.g. an exception during startup handling).
- kill -9 of the job runs none of our code. PR_SET_PDEATHSIG on the server
  alone would miss its workers (the signal only reaches the direct child), so
  the guard receives the parent-death signal instead, sees its parent is gone
  and kills its own group (SIGTERM, then SIGKILL). As a subreaper it also
  reaps the workers. See `draftsmith.runtime.process_guard`.

A signal arriving during teardown is held back until the teardown is complete
(main thread only), so a second Ctrl-C cannot leave half a server running.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from draftsmith.errors import ServerError
from draftsmith.runtime.jobs import set_parent_death_signal
from draftsmith.runtime.process_guard import PARENT_GONE_SIGNAL, group_members

log = logging.getLogger(__name__)

_POLL_S = 0.25
_KILL_WAIT_S = 15.0
_TAIL_LINES = 20
# Flags ending so carry secrets (--api-key, --hf-token); never log their values.
_SECRET_SUFFIXES = ("key", "token", "secret", "password")

# pgid -> server, for the atexit fallback.
_live: dict[int, ManagedServer] = {}


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ManagedServer:
    """Run `cmd` as a server for the duration of a `with` block.

    `env` adds to (and overrides) our own environment. Output goes to
    `log_path` (appended) or to our own stdout/stderr.
    """

    def __init__(
        self,
        cmd: list[str],
        health_url: str,
        *,
        env: dict[str, str] | None = None,
        log_path: Path | None = None,
        startup_timeout_s: float,
        name: str,
        stop_timeout_s: float = 30,
    ) -> None:
        self.cmd = list(cmd)
        self.health_url = health_url
        self.env = env
        self.log_path = Path(log_path) if log_path else None
        self.startup_timeout_s = startup_timeout_s
        self.name = name
        self.stop_timeout_s = stop_timeout_s
        self._proc: subprocess.Popen | None = None
        self._log_offset = 0
        self._stopped = False

    @property
    def pid(self) -> int | None:
        """Pid of the guard, which is also the process group id of the server tree."""
        return self._proc.pid if self._proc else None

    def __enter__(self) -> ManagedServer:
        if self._proc is not None:
            raise RuntimeError(f"{self.name}: a ManagedServer runs its server once")
        try:
            self._refuse_taken_url()
            self._start()
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *_exc) -> None:
        self.stop()

    def stop(self) -> None:
        """Tear down the server's process group; safe to call any number of times."""
        if self._stopped or self._proc is None:
            return
        with _signals_deferred():
            _terminate_group(self._proc, self.stop_timeout_s, self.name)
            _live.pop(self._proc.pid, None)
            self._stopped = True

    def _refuse_taken_url(self) -> None:
        # A server left over on the same port would answer our health checks
        # and requests in place of the one we start.
        with contextlib.suppress(httpx.HTTPError), _client() as client:
            client.get(self.health_url)
            raise ServerError(
                f"{self.name}: something already answers {self.health_url}; "
                "another server holds the port (stop it or choose another port)"
            )

    def _start(self) -> None:
        log.info("%s: starting: %s", self.name, shlex.join(redact(self.cmd)))
        with contextlib.ExitStack() as stack:
            out = None
            if self.log_path:
                self.log_path.parent.mkdir(parents=True, exist_ok=True)
                out = stack.enter_context(open(self.log_path, "ab"))
                self._log_offset = out.tell()
            self._proc = subprocess.Popen(
                _guard_command(self.cmd, self.stop_timeout_s),
                env={**os.environ, **(self.env or {})},
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT if out else None,
                start_new_session=True,
                preexec_fn=_guard_preexec,
            )
        _live[self._proc.pid] = self

    def _wait_healthy(self) -> None:
        assert self._proc is not None
        started = time.monotonic()
        with _client() as client:
            while True:
                code = self._proc.poll()
                if code is not None:
                    raise ServerError(
                        f"{self.name} exited with code {code} before answering "
                        f"{self.health_url}{self._log_tail()}"
                    )
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(self.health_url).status_code == 200:
                        log.info("%s: healthy after %.1f s", self.name, time.monotonic() - started)
                        return
                if time.monotonic() - started > self.startup_timeout_s:
                    raise ServerError(
                        f"{self.name} did not answer {self.health_url} with 200 within "
                        f"{self.startup_timeout_s:g} s{self._log_tail()}"
                    )
                time.sleep(_POLL_S)

    def _log_tail(self) -> str:
        if self.log_path is None:
            return " (its output went to this job's log)"
        with contextlib.suppress(OSError), open(self.log_path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(self._log_offset, size - 64 * 1024))
            lines = f.read().decode(errors="replace").splitlines()[-_TAIL_LINES:]
            return f"; last lines of {self.log_path}:\n" + "\n".join(lines)
        return f"; could not read {self.log_path}"


def run_guarded(
    cmd: list[str], *, env: dict[str, str] | None = None, name: str, stop_timeout_s: float = 30
) -> int:
    """Run `cmd` to completion under the guard (its own process group); returns its exit code.

    For worker groups a job waits on (torchrun and its ranks): output goes to our
    own stdout/stderr (the job log); the whole group is torn down when this call
    leaves, normally, on an exception or on `Interrupted`, and by the guard when
    this process is killed outright.
    """
    log.info("%s: running: %s", name, shlex.join(redact(cmd)))
    proc = subprocess.Popen(
        _guard_command(cmd, stop_timeout_s),
        env={**os.environ, **(env or {})},
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        preexec_fn=_guard_preexec,
    )
    try:
        return proc.wait()
    finally:
        with _signals_deferred():
            _terminate_group(proc, stop_timeout_s, name)


def redact(cmd: list[str]) -> list[str]:
    """`cmd` with the values of secret-looking flags hidden, for logs."""
    out, hide_next = [], False
    for arg in cmd:
        flag, eq, _ = arg.partition("=")
        secret = arg.startswith("--") and flag.lower().endswith(_SECRET_SUFFIXES)
        if hide_next:
            out.append("***")
        elif secret and eq:
            out.append(f"{flag}=***")
        else:
            out.append(arg)
        hide_next = secret and not eq
    return out


def _guard_command(cmd: list[str], stop_timeout_s: float) -> list[str]:
    guard = [sys.executable, "-m", "draftsmith.runtime.process_guard", "--job-pid", str(os.getpid())]
    return [*guard, "--stop-timeout", str(stop_timeout_s), "--", *cmd]


def _client() -> httpx.Client:
    # trust_env=False: a proxy from the environment must not see loopback traffic.
    return httpx.Client(timeout=httpx.Timeout(2.0), trust_env=False)


def _guard_preexec() -> None:
    # Runs in the forked child before exec: the guard learns of our death even after kill -9.
    set_parent_death_signal(PARENT_GONE_SIGNAL)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return bool(group_members(pgid))  # zombies answer killpg but hold nothing


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _wait_group_gone(proc: subprocess.Popen, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while True:
        proc.poll()  # reap the guard: until then it is a zombie member of the group
        if not _group_alive(proc.pid):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def _terminate_group(proc: subprocess.Popen, stop_timeout_s: float, name: str) -> None:
    pgid = proc.pid
    if not _group_alive(pgid):
        proc.poll()
        return
    log.info("%s: stopping process group %d", name, pgid)
    _signal_group(pgid, signal.SIGTERM)
    if not _wait_group_gone(proc, stop_timeout_s):
        log.warning("%s: still running %g s after SIGTERM; sending SIGKILL", name, stop_timeout_s)
        _signal_group(pgid, signal.SIGKILL)
        if not _wait_group_gone(proc, _KILL_WAIT_S):
            log.error("%s: pids %s survived SIGKILL (stuck in the kernel?)", name, group_members(pgid))
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=1)


@contextlib.contextmanager
def _signals_deferred() -> Iterator[None]:
    """Hold SIGTERM/SIGINT until the block is done, then deliver the first one."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    sigs = (signal.SIGTERM, signal.SIGINT)
    old = {sig: signal.signal(sig, lambda signum, _f: pending.append(signum)) for sig in sigs}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
        if pending:
            signal.raise_signal(pending[0])


def _stop_all() -> None:
    for server in list(_live.values()):
        try:
            server.stop()
        except Exception:
            log.exception("%s: teardown at exit failed", server.name)


atexit.register(_stop_all)
