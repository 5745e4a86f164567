"""Group leader for one managed server: `python -m draftsmith.runtime.process_guard --job-pid P -- cmd`.

`draftsmith.runtime.process.ManagedServer` starts this guard in a new session; the guard
starts `cmd` in the same process group and stays its leader:

- It is a child subreaper, so the server's workers, orphaned when the server
  dies, are reparented to the guard and reaped here (never left as zombies).
- When the job process disappears (also after kill -9: the kernel sends the
  guard its parent-death signal, and the guard also checks `getppid()` on every
  wake-up), the guard terminates the whole group: SIGTERM, then SIGKILL after
  `--stop-timeout`.
- When the server exits on its own, the guard terminates what is left of the
  group and exits with the server's exit status.
- The server itself gets PR_SET_PDEATHSIG=SIGKILL, so even a killed guard takes
  the server's main process with it.

Only the standard library and `draftsmith.runtime.jobs` (which needs tqdm) are imported:
the guard must start fast and not fail on a missing optional package.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import select
import signal
import sys
import time
from pathlib import Path

from draftsmith.runtime.jobs import set_parent_death_signal

_PR_SET_CHILD_SUBREAPER = 36
# The job sets this as our parent-death signal; it only means "check getppid()"
# (it also fires when the job thread that started us exits while the job lives).
PARENT_GONE_SIGNAL = signal.SIGUSR1
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_KILL_WAIT_S = 10.0

_stop_signal: int | None = None


def group_members(pgid: int) -> list[int]:
    """Pids in process group `pgid` that are still running (zombies excluded)."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                members.append(int(entry.name))
    return members


def _on_stop(signum: int, _frame) -> None:
    global _stop_signal
    _stop_signal = signum


def _wake(_signum: int, _frame) -> None:
    """Only there so the signal reaches the wakeup fd and ends the select()."""


def _exit_code(status: int) -> int:
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


def _reap(target: int) -> tuple[int | None, bool]:
    """Reap every exited child; return (target's exit code if it exited, any children left)."""
    code = None
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return code, False
        if pid == 0:
            return code, True
        if pid == target:
            code = _exit_code(status)


def _spawn(cmd: list[str]) -> int:
    guard = os.getpid()
    pid = os.fork()
    if pid:
        return pid
    try:
        for sig in (*_STOP_SIGNALS, PARENT_GONE_SIGNAL, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        signal.set_wakeup_fd(-1)
        set_parent_death_signal(signal.SIGKILL)
        if os.getppid() != guard:  # the guard died before the prctl took effect
            os._exit(137)
        os.execvp(cmd[0], cmd)
    except OSError as exc:
        print(f"process_guard: cannot start {cmd[0]!r}: {exc}", file=sys.stderr, flush=True)
    os._exit(127)


def _supervise(server: int, job_pid: int, wakeup: int) -> int | None:
    """Wait until the server exits (its exit code) or we are told to stop (None)."""
    while True:
        code, _ = _reap(server)
        if code is not None:
            return code
        if _stop_signal is not None or os.getppid() != job_pid:
            return None
        select.select([wakeup], [], [], 1.0)
        with contextlib.suppress(BlockingIOError):
            os.read(wakeup, 512)


def _wait_members_gone(pgid: int, timeout_s: float) -> list[int]:
    me = os.getpid()
    deadline = time.monotonic() + timeout_s
    while True:
        _reap(-1)
        others = [pid for pid in group_members(pgid) if pid != me]
        if not others or time.monotonic() > deadline:
            return others
        time.sleep(0.05)


def _stop_group(stop_timeout_s: float) -> None:
    pgid = os.getpgrp()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)  # our own handler only records it
    for pid in _wait_members_gone(pgid, stop_timeout_s):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)  # not killpg: we must live on to reap them
    _wait_members_gone(pgid, _KILL_WAIT_S)
    deadline = time.monotonic() + _KILL_WAIT_S
    while _reap(-1)[1] and time.monotonic() < deadline:
        time.sleep(0.05)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m draftsmith.runtime.process_guard")
    parser.add_argument("--job-pid", type=int, required=True)
    parser.add_argument("--stop-timeout", type=float, default=30.0)
    parser.add_argument("cmd", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.cmd[:1] == ["--"]:
        args.cmd = args.cmd[1:]
    if not args.cmd:
        parser.error("no command given after --")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if os.getpgrp() != os.getpid():
        os.setpgid(0, 0)  # never signal the group of whoever started us
    wakeup_r, wakeup_w = os.pipe()
    os.set_blocking(wakeup_r, False)
    os.set_blocking(wakeup_w, False)
    signal.set_wakeup_fd(wakeup_w)
    for sig in _STOP_SIGNALS:
        signal.signal(sig, _on_stop)
    for sig in (PARENT_GONE_SIGNAL, signal.SIGCHLD):
        signal.signal(sig, _wake)
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    code = _supervise(_spawn(args.cmd), args.job_pid, wakeup_r)
    _stop_group(args.stop_timeout)
    if code is None:
        return 128 + (_stop_signal or signal.SIGTERM)
    return code


if __name__ == "__main__":
    sys.exit(main())
