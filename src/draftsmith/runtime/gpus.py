"""One GPU per concurrent job on one host.

Snakemake sets no device ids for local runs, so two shard jobs that each ask
for `gpu=1` would both land on GPU 0. A job instead calls `acquire_gpus(n)`
first thing, before anything imports torch and initialises CUDA (CUDA reads
`CUDA_VISIBLE_DEVICES` once, at initialisation; a later change is ignored):

    with acquire_gpus(1) as lease:
        ...  # CUDA_VISIBLE_DEVICES now names lease.devices only

Each device has a lock file; holding an exclusive `fcntl.flock` on it is what
owns the device. The kernel drops a flock when its holder exits, however it
exits (kill -9 included), so a crashed job can never leave a device taken;
a pid file would need someone to notice the pid is gone and could be fooled by
pid reuse. All jobs must name devices the same way (the same
`CUDA_VISIBLE_DEVICES`, or none), since the lock files are keyed by name.

A job asking for several devices takes all of them or none, so two jobs can
never each hold half of what the other needs.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

from draftsmith.errors import DraftsmithError

log = logging.getLogger(__name__)

_ENV = "CUDA_VISIBLE_DEVICES"
_POLL_S = 0.2
_PROBE_TIMEOUT_S = 60


class GpuLeaseError(DraftsmithError):
    """GPUs could not be leased: too many asked for, or none freed in time."""


class GpuLease:
    """Exclusive use of `devices` (physical ids) until `release()` or the end of a `with` block."""

    def __init__(self, devices: list[str], fds: list[int]) -> None:
        self.devices = list(devices)
        self._fds = fds
        self._previous = os.environ.get(_ENV)
        self._released = False
        if self.devices:
            os.environ[_ENV] = ",".join(self.devices)

    def __enter__(self) -> GpuLease:
        return self

    def __exit__(self, *_exc) -> None:
        self.release()

    def release(self) -> None:
        """Give the devices back; safe to call more than once."""
        if self._released:
            return
        self._released = True
        for fd in self._fds:
            os.close(fd)  # closing the last descriptor drops the flock
        if not self.devices:
            return
        if self._previous is None:
            os.environ.pop(_ENV, None)
        else:
            os.environ[_ENV] = self._previous


def acquire_gpus(
    count: int,
    *,
    visible: list[str] | None = None,
    lock_dir: Path | None = None,
    timeout_s: float = 600,
) -> GpuLease:
    """Lease `count` free devices of `visible` (default: what this host shows), waiting if all are taken."""
    if count < 0:
        raise GpuLeaseError(f"cannot lease {count} GPUs")
    if count == 0:
        return GpuLease([], [])
    devices = list(visible) if visible is not None else visible_devices()
    if not devices:
        log.info("no GPU on this host: running on CPU")
        return GpuLease([], [])
    if count > len(devices):
        raise GpuLeaseError(
            f"asked for {count} GPUs but only {len(devices)} are visible ({','.join(devices)})"
        )
    _refuse_initialised_cuda()
    return _wait_for(count, devices, _lock_dir(lock_dir), timeout_s)


def visible_devices() -> list[str]:
    """Device ids this process may use: CUDA_VISIBLE_DEVICES, else nvidia-smi, else torch's count."""
    env = os.environ.get(_ENV)
    if env is not None:
        return [dev.strip() for dev in env.split(",") if dev.strip()]
    count = _nvidia_smi_count()
    if count is None:
        count = _torch_count()
    return [str(i) for i in range(count)]


def _nvidia_smi_count() -> int | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=_PROBE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def _torch_count() -> int:
    # In a child: torch.cuda.device_count() initialises the CUDA driver, after
    # which this process would ignore the CUDA_VISIBLE_DEVICES we are about to set.
    code = "import torch; print(torch.cuda.device_count())"
    try:
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=_PROBE_TIMEOUT_S
        )
        return int(out.stdout.strip() or 0) if out.returncode == 0 else 0
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return 0


def _refuse_initialised_cuda() -> None:
    torch = sys.modules.get("torch")  # never import it here: that is what we must precede
    if torch is not None and torch.cuda.is_initialized():
        raise GpuLeaseError(
            "CUDA is already initialised in this process, so CUDA_VISIBLE_DEVICES can no "
            "longer take effect; lease GPUs before using torch.cuda"
        )


def _lock_dir(lock_dir: Path | None) -> Path:
    path = Path(lock_dir) if lock_dir is not None else Path(f"/tmp/draftsmith-gpu-locks-{os.getuid()}")
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = path.lstat()
    # A directory planted by another user could hand us their lock files.
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise GpuLeaseError(f"{path}: GPU lock directory is not a directory owned by this user")
    return path


def _wait_for(count: int, devices: list[str], lock_dir: Path, timeout_s: float) -> GpuLease:
    deadline = time.monotonic() + timeout_s
    waiting_logged = False
    while True:
        got = _try_lock(count, devices, lock_dir)
        if got is not None:
            chosen, fds = got
            log.info("leased GPU(s) %s", ",".join(chosen))
            return GpuLease(chosen, fds)
        if not waiting_logged:
            log.info(
                "waiting for %d free GPU(s) of %s (held by pids %s)",
                count,
                ",".join(devices),
                ",".join(_holders(devices, lock_dir)) or "?",
            )
            waiting_logged = True
        if time.monotonic() > deadline:
            raise GpuLeaseError(
                f"no {count} of GPUs {','.join(devices)} became free within {timeout_s:g} s "
                f"(locks in {lock_dir})"
            )
        time.sleep(_POLL_S)


def _try_lock(count: int, devices: list[str], lock_dir: Path) -> tuple[list[str], list[int]] | None:
    chosen: list[str] = []
    fds: list[int] = []
    for dev in devices:
        fd = _lock_one(_lock_path(lock_dir, dev))
        if fd is None:
            continue
        chosen.append(dev)
        fds.append(fd)
        if len(chosen) == count:
            return chosen, fds
    for fd in fds:  # all or nothing: holding part of a set while waiting can deadlock
        os.close(fd)
    return None


def _lock_one(path: Path) -> int | None:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)  # not inherited by children (PEP 446)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    # Only for the log line of a waiting job; the flock, not this pid, is the lease.
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def _lock_path(lock_dir: Path, dev: str) -> Path:
    return lock_dir / f"gpu-{re.sub(r'[^A-Za-z0-9._-]', '_', dev)}.lock"


def _holders(devices: list[str], lock_dir: Path) -> list[str]:
    pids = []
    for dev in devices:
        with contextlib.suppress(OSError):
            pid = _lock_path(lock_dir, dev).read_text().strip()
            if pid:
                pids.append(pid)
    return pids
