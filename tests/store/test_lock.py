"""Store locks and leftovers: one builder per job across processes, dead owners' temps removed."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from draftsmith.fsutil import atomic
from draftsmith.store import lock, manifest
from draftsmith.store.journal import Journal
from draftsmith.store.layout import MANIFEST
from draftsmith.store.plan import Artifact

HOLD = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from draftsmith.store import lock
    with lock.held(Path(sys.argv[1])):
        print("held", flush=True)
        time.sleep(float(sys.argv[2]))
        if len(sys.argv) > 3:
            for name in sys.argv[3:]:
                Path(name).write_text("built by the holder")
    """
)


def hold(path: Path, seconds: float, *writes: Path) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(path), str(seconds), *map(str, writes)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_lock_path_is_the_jobs_first_output_under_the_store(tmp_path):
    root = tmp_path / "store"
    built = root / "hidden" / "0123456789abcdef" / "shard-00001.bin"
    assert lock.lock_path(root, built) == root / ".locks" / "hidden/0123456789abcdef/shard-00001.bin.lock"
    with pytest.raises(ValueError, match="not under the store"):
        lock.lock_path(root, tmp_path / "results" / "x.md")


def test_a_second_builder_waits_then_finds_the_work_done(tmp_path):
    root = tmp_path / "store"
    outputs = [root / "vocab" / "k" / "vocab.json", root / "vocab" / "k" / "vocab.safetensors"]
    outputs[0].parent.mkdir(parents=True)
    holder = hold(lock.lock_path(root, outputs[0]), 1.0, *outputs)
    started = time.monotonic()
    with lock.building(root, outputs) as needed:
        waited = time.monotonic() - started
    holder.wait()
    assert needed is False and waited > 0.5  # it waited for the holder, then skipped


def test_a_killed_holder_releases_its_lock(tmp_path):
    root = tmp_path / "store"
    outputs = [root / "tokens" / "a" / "k" / "tokens.jsonl"]
    holder = hold(lock.lock_path(root, outputs[0]), 60)
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    started = time.monotonic()
    with lock.building(root, outputs) as needed:
        assert needed is True  # nothing was built: the work is still to do
    assert time.monotonic() - started < 5


def test_jobs_writing_outside_the_store_take_no_lock(tmp_path):
    with lock.building(tmp_path / "store", [tmp_path / "results" / "benchmark.md"]) as needed:
        assert needed is True
    assert not (tmp_path / "store").exists()


def test_complete_needs_every_output_and_a_whole_manifest(tmp_path):
    out = tmp_path / "store" / "merged" / "k"
    atomic.write_text(out / "train.jsonl", "{}\n")
    outputs = [out / "train.jsonl", out / MANIFEST]
    assert not lock.complete(outputs)
    manifest.write(
        Artifact("merged", {}, {}, out, "k"), out / MANIFEST, [out / "train.jsonl"], {}, time.time()
    )
    assert lock.complete(outputs)
    (out / "train.jsonl").write_text("{}\n{}\n")  # a file that changed size is not finished work
    assert not lock.complete(outputs)


def test_stale_temps_of_dead_processes_go_live_ones_stay(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    host = socket.gethostname()
    leftover = tmp_path / f".tmp-model.json@{host}-{dead.pid}.abcd1234"
    leftover_dir = tmp_path / f".tmp-gguf@{host}-{dead.pid}.x1"
    live = tmp_path / f"{atomic.temp_prefix('tokens.jsonl')}zz"
    remote = tmp_path / f".tmp-x@another-host-{dead.pid}.q"
    unowned_old, unowned_new = tmp_path / ".tmp-old.x", tmp_path / ".tmp-new.x"
    for path in (leftover, live, remote, unowned_old, unowned_new):
        path.write_text("partial")
    (leftover_dir / "hf").mkdir(parents=True)
    day_ago = time.time() - atomic.UNOWNED_STALE_S - 60
    os.utime(unowned_old, (day_ago, day_ago))
    removed = atomic.remove_stale_temps(tmp_path)
    assert sorted(removed) == sorted([leftover, leftover_dir, unowned_old])
    assert live.exists() and remote.exists() and unowned_new.exists()


def test_a_journal_never_holds_an_id_twice(tmp_path):
    journal = Journal(tmp_path / "journal.jsonl")
    assert journal.append({"id": "a", "text": "first"}) is True
    assert journal.append({"id": "a", "text": "again"}) is False
    journal.close()
    again = Journal(tmp_path / "journal.jsonl")
    assert again.append({"id": "a", "text": "third"}) is False
    again.close()
    assert (tmp_path / "journal.jsonl").read_text().count('"id":"a"') == 1


@pytest.fixture
def small_fs(tmp_path):
    """A 1 MiB tmpfs: a real full disk (needs root, as on the CI machine)."""
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", str(mount)], check=True)


def test_a_full_disk_names_the_file(small_fs):
    target = small_fs / "train" / "k" / "ckpt-00000.pt"
    full = pytest.raises(atomic.DiskFullError, match=f"disk full at {target}")
    with full, atomic.atomic_open(target, "wb") as handle:
        handle.write(b"\0" * (2 << 20))
    assert list(target.parent.iterdir()) == []  # no temp left behind


def test_a_full_disk_under_torch_save_names_the_file(small_fs):
    import torch

    target = small_fs / "ckpt.pt"
    full = pytest.raises(atomic.DiskFullError, match=rf"disk full at {target} \([\d,]{{1,9}} bytes free\)")
    with full, atomic.atomic_open(target, "wb") as handle:
        torch.save({"weights": torch.zeros(1 << 19)}, handle)
