"""Sample addresses, assigning only what the states store lacks, shard balance, the
estimate, the disk refusal, and batching."""

from __future__ import annotations

import pytest

from draftsmith.fsutil import atomic
from draftsmith.hidden import assign, estimate
from draftsmith.hidden.hf import MergedSample, batches
from draftsmith.store.hashing import sample_address
from draftsmith.store.layout import shard_name


def test_assign_balances_tokens_and_is_deterministic():
    samples = [(f"s{i}", 10 + (i * 37) % 200) for i in range(500)]
    shards = assign.assign(samples, 8)
    assert assign.assign(list(reversed(samples)), 8) == shards  # input order does not matter
    assert sorted(i for s in shards for i in s) == sorted(i for i, _ in samples)
    loads = [sum(dict(samples)[i] for i in s) for s in shards]
    assert max(loads) - min(loads) <= 200  # within one sample of each other


def test_more_shards_than_samples_leaves_empty_shards():
    assert sum(map(len, assign.assign([("a", 5), ("b", 3)], 4))) == 2


def sample(i: int, length: int = 3) -> dict:
    return {
        "id": f"d-{i:06d}",
        "input_ids": [i + k for k in range(length)],
        "loss_mask": [0] + [1] * (length - 1),
    }


def store_shard(store, rows: list[dict]) -> str:
    """A finished shard in `store` holding `rows` (states are zeros: only addresses count here)."""
    import torch

    from draftsmith.formats.shards.writer import ShardWriter

    addressed = [(sample_address(r["input_ids"], r["loss_mask"]), r) for r in rows]
    name = shard_name([a for a, _ in addressed])
    with ShardWriter(store, name, mode="raw", hidden_size=4, dtype="float32", meta={}) as writer:
        for address, r in addressed:
            n = len(r["input_ids"])
            writer.add(address, r["input_ids"], r["loss_mask"], torch.zeros(n, 12), torch.zeros(n, 4))
    return name


def test_the_address_is_the_ids_and_the_mask_whatever_their_container():
    import numpy as np
    import torch

    ids, mask = [5, 6, 7], [0, 1, 1]
    address = sample_address(ids, mask)
    assert address == sample_address(np.array(ids), np.array(mask, dtype=bool))
    assert address == sample_address(torch.tensor(ids), torch.tensor(mask, dtype=torch.uint8))
    assert address != sample_address([5, 6, 8], mask) and address != sample_address(ids, [1, 1, 1])
    assert shard_name([address, "b"]) == shard_name(["b", address])  # named by content, not order


def test_only_samples_the_store_lacks_are_assigned_once(tmp_path):
    store, merged = tmp_path / "store", tmp_path / "train.jsonl"
    rows = [sample(i, 3 + i % 4) for i in range(12)]
    stored = store_shard(store, rows[:5])
    atomic.write_jsonl(merged, [rows[i] for i in (7, 1, 11, 3, 0, 9, 2, 4, 8, 5, 10, 6)])
    view = assign.build(merged, store, num_shards=3)
    assert [r[0] for r in view["samples"]] == [rows[i]["id"] for i in (7, 1, 11, 3, 0, 9, 2, 4, 8, 5, 10, 6)]
    assert view["stored_samples"] == 5 and len(view["new_shards"]) == 3
    assert view["extract_tokens"] == sum(len(r["input_ids"]) for r in rows[5:])
    in_new = {a for r in view["samples"] if r[2] != stored for a in [r[1]]}
    assert in_new == {sample_address(r["input_ids"], r["loss_mask"]) for r in rows[5:]}
    for name in view["new_shards"]:  # each new shard's samples are in the store, named by them
        kept = list(atomic.read_jsonl(store / "samples" / f"{name}.jsonl"))
        assert shard_name([r["address"] for r in kept]) == name
    # Another mix (a shuffle, a dropped dataset) planned now assigns nothing new: its
    # samples are stored or already assigned to a shard, which it waits for.
    atomic.write_jsonl(merged, list(reversed(rows[3:])))
    again = assign.build(merged, store, num_shards=3)
    assert again["new_shards"] == [] and set(again["to_extract"]) == set(view["new_shards"])
    # Adding a dataset assigns its samples alone.
    extra = [sample(100 + i) for i in range(4)]
    atomic.write_jsonl(merged, rows + extra)
    added = assign.build(merged, store, num_shards=8)
    assert (
        len(added["new_shards"]) == 4
        and added["extract_tokens"] == sum(len(r["input_ids"]) for r in extra) + (view["extract_tokens"])
    )


def test_a_sample_twice_in_a_mix_is_one_stored_row(tmp_path):
    store, merged = tmp_path / "store", tmp_path / "train.jsonl"
    atomic.write_jsonl(merged, [sample(1), {**sample(1), "id": "other-000001"}, sample(2)])
    view = assign.build(merged, store, num_shards=4)
    assert view["num_samples"] == 3 and view["distinct_samples"] == 2 and len(view["new_shards"]) == 2
    assert view["samples"][0][1:] == view["samples"][1][1:]


def test_check_disk_refuses_with_override():
    # Sizes a person can compare: not "0.01 GB vs 0.01 GB".
    message = r"needs ~12.3 MB \(12,345,678 bytes\) but only 9.9 MB \(9,876,543 bytes\) are free"
    with pytest.raises(estimate.DiskSpaceError, match=message):
        estimate.check_disk(12_345_678, 9_876_543, allow=False, what="extraction")
    with pytest.raises(estimate.DiskSpaceError, match="allow_disk_overcommit"):
        estimate.check_disk(2_000, 1_000, allow=False, what="extraction")
    estimate.check_disk(2_000, 1_000, allow=True, what="extraction")


def test_estimate_bytes_by_mode(tmp_path):
    assignment = {
        "num_samples": 5,
        "num_tokens": 1500,
        "stored_samples": 2,
        "to_extract": {"shard-a": {"samples": 2, "tokens": 600}, "shard-b": {"samples": 1, "tokens": 400}},
        "extract_tokens": 1000,
    }
    report = estimate.estimate(
        assignment, 4096, "bfloat16", tmp_path, storage_mode="raw", throughput_tok_s=100.0
    )
    raw = report["bytes_by_mode"]["raw"]
    assert raw >= 1000 * 4 * 4096 * 2  # 3 aux + final states, bf16
    assert report["bytes_by_mode"]["fp8"] < 0.55 * raw and report["bytes_by_mode"]["zstd"] < raw
    assert report["estimated_hours"] == pytest.approx(1000 / 100 / 3600, abs=1e-3)
    assert report["free_bytes"] > 0 and "estimated hours" in estimate.markdown(report, "x")


def test_batches_respect_the_token_budget_and_keep_every_sample():
    samples = [MergedSample(f"s{i}", [1] * (5 + i % 17), [1] * (5 + i % 17)) for i in range(100)]
    out = list(batches(samples, 64))
    assert sorted(s.id for b in out for s in b) == sorted(s.id for s in samples)
    for batch in out:
        assert len(batch) == 1 or len(batch) * len(batch[0].input_ids) <= 64
        assert len(batch[0].input_ids) == max(len(s.input_ids) for s in batch)


def test_two_assigners_at_once_never_assign_a_sample_twice(tmp_path):
    import subprocess
    import sys

    root = tmp_path / "artifacts"
    store = root / "hidden" / "0123456789abcdef"
    rows = [sample(i, 2 + i % 5) for i in range(40)]
    mixes = [tmp_path / "a.jsonl", tmp_path / "b.jsonl"]
    atomic.write_jsonl(mixes[0], rows[:30])  # two mixes sharing 20 samples
    atomic.write_jsonl(mixes[1], rows[10:])
    code = "import sys; from pathlib import Path; from draftsmith.hidden import assign; "
    code += "assign.build_locked(*map(Path, sys.argv[1:4]), num_shards=3)"
    workers = [subprocess.Popen([sys.executable, "-c", code, str(root), str(store), str(m)]) for m in mixes]
    assert [worker.wait(60) for worker in workers] == [0, 0]
    assigned = [r["address"] for p in (store / "samples").glob("*.jsonl") for r in atomic.read_jsonl(p)]
    assert len(assigned) == len(set(assigned)) == 40  # each sample in exactly one shard
    for mix in mixes:  # and each mix, planned again, finds every sample assigned
        assert assign.build(mix, store, num_shards=3)["new_shards"] == []
