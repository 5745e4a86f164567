"""Draft training on a GPU: torchrun (NCCL) equals one process, and resume is exact.

Skipped without CUDA; run on a GPU machine with `pytest tests/test_train_gpu.py`.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from train.test_train import assert_ttt_attention_matches_explicit, hidden, read_records, spec  # noqa: F401 (fixtures)

from draftsmith.train import loop as train
from draftsmith.train.launch import launch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture
def gpu_spec(spec):  # noqa: F811 (the fixture above)
    return replace(spec, train=replace(spec.train, device="cuda", dtype="bfloat16", gpus=1))


def assert_close_records(a: list[dict], b: list[dict], rel: float) -> None:
    assert [(r["kind"], r["step"], r["count_pos"], r["tokens"]) for r in a] == [
        (r["kind"], r["step"], r["count_pos"], r["tokens"]) for r in b
    ]
    for x, y in zip(a, b, strict=True):
        assert math.isclose(x["loss"], y["loss"], rel_tol=rel), (x["step"], x["loss"], y["loss"])


@pytest.mark.parametrize("dtype, tol", [(torch.bfloat16, 3e-2), (torch.float32, 1e-5)])
@pytest.mark.parametrize("steps", [1, 3])
def test_ttt_attention_on_the_cuda_kernels(steps, dtype, tol):
    """FlashAttention (bfloat16) and the memory-efficient kernel (float32)."""
    assert_ttt_attention_matches_explicit(steps, dtype, "cuda", tol)


def test_torchrun_nccl_on_one_gpu_equals_one_process(gpu_spec, tmp_path):
    one = train.run_segment(gpu_spec, 0, None, tmp_path / "one.pt", tmp_path / "one.jsonl")
    launch(
        gpu_spec, 0, None, tmp_path / "tr.pt", tmp_path / "tr.jsonl", world_size=1, threads=2, torchrun=True
    )
    # Attention's backward uses atomics on the GPU: equal up to summation order.
    assert_close_records(one["records"], read_records(tmp_path / "tr.jsonl"), rel=2e-2)
    a = torch.load(tmp_path / "one.pt", weights_only=True)["model"]
    b = torch.load(tmp_path / "tr.pt", weights_only=True)["model"]
    assert a.keys() == b.keys()


def test_two_segments_on_gpu_equal_one_run(gpu_spec, tmp_path):
    whole = replace(gpu_spec, train=replace(gpu_spec.train, checkpoint_every=gpu_spec.train.total_steps))
    straight = train.run_segment(whole, 0, None, tmp_path / "w.pt", tmp_path / "w.jsonl")["records"]
    first = train.run_segment(gpu_spec, 0, None, tmp_path / "c0.pt", tmp_path / "m0.jsonl")["records"]
    second = train.run_segment(gpu_spec, 1, tmp_path / "c0.pt", tmp_path / "c1.pt", tmp_path / "m1.jsonl")
    resumed = [r for r in first + second["records"] if r["kind"] == "train"]
    assert_close_records([r for r in straight if r["kind"] == "train"], resumed, rel=2e-2)
