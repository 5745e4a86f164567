"""Shard plan balance and determinism, the plan report, the disk refusal, and batching."""

from __future__ import annotations

import pytest

from draftsmith.hidden import assign, estimate
from draftsmith.hidden.hf import MergedSample, batches


def test_assign_balances_tokens_and_is_deterministic():
    samples = [(f"s{i}", 10 + (i * 37) % 200) for i in range(500)]
    shards = assign.assign(samples, 8)
    assert assign.assign(list(reversed(samples)), 8) == shards  # input order does not matter
    assert sorted(i for s in shards for i in s) == sorted(i for i, _ in samples)
    loads = [sum(dict(samples)[i] for i in s) for s in shards]
    assert max(loads) - min(loads) <= 200  # within one sample of each other


def test_more_shards_than_samples_leaves_empty_shards():
    assert sum(map(len, assign.assign([("a", 5), ("b", 3)], 4))) == 2


def test_check_disk_refuses_with_override():
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
