"""Runtime for the process behind one Snakemake job.

- Output goes to the rule's log file, with a progress bar for long steps.
- The job dies with Snakemake: after kill -9 of the snakemake process its jobs
  would otherwise keep running (a GPU job keeps its memory). A watchdog thread
  follows the nearest ancestor that is a snakemake process and turns its death
  into SIGTERM for this process, whose handler unwinds (tearing down any server
  this job started) instead of dying mid-write. A job that finds no snakemake
  ancestor when it starts (killed while the job was importing) does not begin.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from tqdm import tqdm

from draftsmith.fsutil import atomic
from draftsmith.store import lock
from draftsmith.store.plan import check_planned, plan_for

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


class Interrupted(SystemExit):
    """Raised in the main thread on SIGTERM/SIGINT so `finally` blocks run."""


def set_parent_death_signal(sig: int = signal.SIGTERM) -> None:
    """Ask the kernel to send `sig` when our parent exits (Linux only)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)


def _parent(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])


def _cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")


def find_ancestor(marker: str = "snakemake") -> int | None:
    """The nearest ancestor whose command line mentions `marker`."""
    pid = os.getpid()
    with contextlib.suppress(OSError, ValueError, IndexError):
        while pid > 1:
            pid = _parent(pid)
            if pid > 1 and marker in _cmdline(pid):
                return pid
    return None


def watch_ancestor(pid: int, interval_s: float = 0.5) -> threading.Thread:
    def watch() -> None:
        while atomic.pid_alive(pid):
            time.sleep(interval_s)
        log.error("snakemake (pid %d) is gone: stopping this job", pid)
        os.kill(os.getpid(), signal.SIGTERM)

    thread = threading.Thread(target=watch, name="parent-watchdog", daemon=True)
    thread.start()
    return thread


def _raise_interrupted(signum: int, _frame) -> None:
    raise Interrupted(128 + signum)


def install_signal_handlers() -> None:
    signal.signal(signal.SIGTERM, _raise_interrupted)
    signal.signal(signal.SIGINT, _raise_interrupted)


@contextlib.contextmanager
def job(log_path: str | os.PathLike | None, name: str) -> Iterator[logging.Logger]:
    """Set up logging, signal handling and parent watching for one job."""
    if log_path:
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
        force=True,
    )
    install_signal_handlers()
    set_parent_death_signal()
    ancestor = find_ancestor()
    if ancestor is None:
        # Snakemake was killed while this job was still starting (imports take seconds):
        # nothing would stop the job, so it must not begin.
        log.error("%s: the snakemake that started this job is gone: not starting", name)
        raise Interrupted(128 + signal.SIGTERM)
    watch_ancestor(ancestor)
    started = time.time()
    try:
        # Inside the try: a SIGTERM just after this line (the test of a dying snakemake
        # kills it the moment the line appears) is still logged as an interruption.
        log.info("%s: started (pid %d)", name, os.getpid())
        yield log
    except Interrupted:
        log.error("%s: interrupted after %.1f s; resumable state kept", name, time.time() - started)
        raise
    except Exception:
        log.exception("%s: failed after %.1f s", name, time.time() - started)
        raise
    log.info("%s: finished in %.1f s", name, time.time() - started)


def progress(total: int | None, desc: str, unit: str = "sample", initial: int = 0) -> tqdm:
    """A progress bar for a job log: items, rate and ETA, refreshed every few seconds."""
    return tqdm(
        total=total,
        initial=initial,
        desc=desc,
        unit=unit,
        file=sys.stderr,
        mininterval=2.0,
        ascii=True,
        dynamic_ncols=False,
        ncols=110,
    )


class TokenRate:
    """Tokens per second over a job, shown as a progress-bar postfix."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.tokens = 0

    def add(self, tokens: int) -> str:
        self.tokens += tokens
        elapsed = max(time.monotonic() - self.started, 1e-9)
        return f"{self.tokens / elapsed:.1f} tok/s"


def optional_input(value: str | Sequence[str] | None) -> str | None:
    """The one path of a rule input that a config may leave out (given as a list of 0 or 1 paths)."""
    paths = [value] if isinstance(value, str) else list(value or [])
    return paths[0] if paths else None


def from_snakemake(smk, stage: Callable[..., object]) -> None:
    """Run a stage's entry function for a Snakemake `script:` job, logging to the rule's log.

    The function gets the rule's named inputs and outputs, its log file and its params:
    its stage's settings and planned artifact (`settings`, `artifact`, resolved once by
    `workflow.configure`), and what else the rule hands it; a stage that needs the job's
    thread count declares it as a param (`threads=lambda wildcards, threads: threads`).
    The job still plans the raw config once, to refuse outputs an input changed under. A
    job that builds into the store holds its store lock (`store.lock`) and skips the work
    when another process finished it meanwhile.
    """
    # Native thread pools (OpenMP in torch, BLAS) size themselves from this when they
    # start: jobs sharing a small box must not each start one thread per core (a
    # 2-core machine slowed ~25x when they did). Our own code never reads it.
    os.environ["OMP_NUM_THREADS"] = str(smk.threads)
    log_file = smk.log[0] if smk.log else None
    with (
        job(log_file, f"{smk.rule} {dict(smk.wildcards)}"),
        lock.building(Path(smk.config["artifacts_dir"]), list(smk.output)) as needed,
    ):
        if not needed:
            return
        check_planned(plan_for(smk.config), list(smk.output))
        try:
            stage(
                inputs=dict(smk.input.items()),
                outputs=dict(smk.output.items()),
                log_file=log_file,
                **dict(smk.params.items()),
            )
        except Exception as exc:
            full = atomic.disk_full(smk.output[0], exc) if smk.output else None
            if full is not None:
                raise full from exc
            raise
