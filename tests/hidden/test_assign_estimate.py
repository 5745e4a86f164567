"""Shard plan balance and determinism, the plan report, the disk refusal, and batching."""

from __future__ import annotations

import pytest

from draftsmith.errors import ConfigError
from draftsmith.hidden import assign, estimate
from draftsmith.hidden.hf import MergedSample, batches
from draftsmith.store import atomic


def test_assign_balances_tokens_and_is_deterministic():
    samples = [(f"s{i}", 10 + (i * 37) % 200) for i in range(500)]
    shards = assign.assign(samples, 8)
    assert assign.assign(list(reversed(samples)), 8) == shards  # input order does not matter
    assert sorted(i for s in shards for i in s) == sorted(i for i, _ in samples)
    loads = [sum(dict(samples)[i] for i in s) for s in shards]
    assert max(loads) - min(loads) <= 200  # within one sample of each other


def test_more_shards_than_samples_leaves_empty_shards():
    assert sum(map(len, assign.assign([("a", 5), ("b", 3)], 4))) == 2


def test_more_shards_than_samples_in_the_data_is_refused(tmp_path):
    merged = tmp_path / "train.jsonl"
    atomic.write_jsonl(merged, [{"id": f"s{i}", "input_ids": [1, 2]} for i in range(3)])
    names = [f"shard-{i:05d}" for i in range(4)]
    with pytest.raises(ConfigError, match=r"extract.num_shards: 4 shards for 3 samples"):
        assign.build(merged, 4, names)
    assert assign.build(merged, 3, names[:3])["num_samples"] == 3


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
        "num_shards": 2,
        "num_samples": 3,
        "num_tokens": 1000,
        "shards": [{"num_tokens": 600}, {"num_tokens": 400}],
    }
    extract_cfg = {"storage": "raw", "throughput_tok_s": 100.0}
    report = estimate.estimate(assignment, 4096, "bfloat16", extract_cfg, tmp_path)
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
