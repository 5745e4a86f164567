"""GPU leases between real concurrent processes (no GPU needed: devices are named, not used)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from draftsmith.errors import DraftsmithError
from draftsmith.runtime.gpus import GpuLeaseError, acquire_gpus, visible_devices

DEVICES = ["0", "1", "2"]

# A job: lease `count` devices, report them with the time, hold them, report the release.
JOB = """
import os, sys, time
from pathlib import Path
from draftsmith.runtime.gpus import acquire_gpus
devices, lock_dir, hold_s = sys.argv[1].split(","), Path(sys.argv[2]), float(sys.argv[3])
with acquire_gpus(1, visible=devices, lock_dir=lock_dir, timeout_s=30):
    print("got", os.environ["CUDA_VISIBLE_DEVICES"], time.time(), flush=True)
    time.sleep(hold_s)
    print("released", time.time(), flush=True)
"""


def _start(devices: list[str], lock_dir: Path, hold_s: float) -> subprocess.Popen:
    cmd = [sys.executable, "-c", JOB, ",".join(devices), str(lock_dir), str(hold_s)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)


def _report(proc: subprocess.Popen) -> dict:
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    got, released = out.splitlines()
    _, device, got_at = got.split()
    return {"device": device, "got": float(got_at), "released": float(released.split()[1])}


def _read_got(proc: subprocess.Popen) -> str:
    line = proc.stdout.readline()
    assert line.startswith("got"), line
    return line.split()[1]


def test_concurrent_jobs_get_distinct_devices_and_a_fourth_waits(tmp_path):
    procs = [_start(DEVICES, tmp_path, 3.0) for _ in range(4)]
    reports = sorted((_report(p) for p in procs), key=lambda r: r["got"])
    first, last = reports[:3], reports[3]
    assert sorted(r["device"] for r in first) == DEVICES  # one device each
    # The fourth got its device only once one of the first three gave it back.
    freed = [r for r in first if r["device"] == last["device"]]
    assert len(freed) == 1
    assert last["got"] >= freed[0]["released"] - 0.05  # clock reads straddle the unlock
    assert last["got"] >= min(r["got"] for r in first) + 1.0


def test_a_killed_job_frees_its_device(tmp_path):
    holder = _start(["0"], tmp_path, 120)
    assert _read_got(holder) == "0"
    waiter = _start(["0"], tmp_path, 0)
    time.sleep(0.5)
    assert waiter.poll() is None  # still waiting for the only device
    os.kill(holder.pid, signal.SIGKILL)  # runs none of its code: the kernel drops the flock
    holder.wait(timeout=10)
    assert _report(waiter)["device"] == "0"


def test_two_devices_in_one_lease_and_env_restored(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2")
    with acquire_gpus(2, visible=DEVICES, lock_dir=tmp_path) as lease:
        assert len(set(lease.devices)) == 2
        assert os.environ["CUDA_VISIBLE_DEVICES"] == ",".join(lease.devices)
        with acquire_gpus(1, visible=DEVICES, lock_dir=tmp_path) as other:
            assert other.devices[0] not in lease.devices
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1,2"


def test_all_or_nothing_then_timeout(tmp_path):
    with acquire_gpus(1, visible=["0", "1"], lock_dir=tmp_path) as held:
        started = time.monotonic()
        with pytest.raises(GpuLeaseError, match="became free within"):
            acquire_gpus(2, visible=["0", "1"], lock_dir=tmp_path, timeout_s=0.5)
        assert time.monotonic() - started >= 0.5
        # The failed attempt kept nothing: the free device is still free.
        with acquire_gpus(1, visible=["0", "1"], lock_dir=tmp_path) as lease:
            assert lease.devices != held.devices


def test_more_than_visible_is_refused(tmp_path):
    with pytest.raises(GpuLeaseError, match="asked for 4 GPUs but only 3") as info:
        acquire_gpus(4, visible=DEVICES, lock_dir=tmp_path)
    assert isinstance(info.value, DraftsmithError)


@pytest.mark.parametrize(("count", "visible"), [(1, []), (0, DEVICES)])
def test_no_gpu_is_a_no_op(tmp_path, monkeypatch, count, visible):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with acquire_gpus(count, visible=visible, lock_dir=tmp_path) as lease:
        assert lease.devices == []
        assert "CUDA_VISIBLE_DEVICES" not in os.environ
    assert list(tmp_path.iterdir()) == []


def test_visible_devices_from_env(monkeypatch, tmp_path):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3, 5")
    assert visible_devices() == ["3", "5"]
    with acquire_gpus(1, lock_dir=tmp_path) as lease:
        assert lease.devices == ["3"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # CUDA's way to hide every device
    assert visible_devices() == []


def test_visible_devices_from_nvidia_smi(monkeypatch, tmp_path):
    fake = tmp_path / "nvidia-smi"
    fake.write_text(
        "#!/bin/sh\necho 'GPU 0: NVIDIA H200 (UUID: GPU-aaaa)'\necho 'GPU 1: NVIDIA H200 (UUID: GPU-bbbb)'\n"
    )
    fake.chmod(0o755)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert visible_devices() == ["0", "1"]


def test_without_nvidia_smi_asks_torch_in_a_child(monkeypatch, tmp_path):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi here
    assert visible_devices() == []  # this CPU machine's torch sees no GPU


def test_module_does_not_import_torch():
    code = "import sys, draftsmith.runtime.gpus; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
