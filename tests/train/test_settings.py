"""The training stage's settings: the checks of train settings that cannot work together,
the values derived from other sections, and the rank job's JSON round trip."""

from __future__ import annotations

import json

import pytest

from draftsmith import config as cfg
from draftsmith.errors import ConfigError
from draftsmith.train.settings import LoopSettings, TrainSettings, TrainSpec


def validated(**train) -> dict:
    return cfg.validate(
        {
            "experiment": "t",
            "model": {"source": {"kind": "hf_dir", "path": "unused"}, "trust_remote_code": True},
            "datasets": {"a": {"path": "a.jsonl", "format": "prompt"}},
            "tokenize": {"max_length": 512},
            "evaluate": {"enabled": False},
            "train": train,
        }
    )


@pytest.mark.parametrize(
    ("train", "expected"),
    [
        ({"gpus": 2, "grad_accum": 3}, "train.grad_accum (3) must be a multiple of train.gpus"),
        ({"batch_tokens": 256}, "train.batch_tokens (256) is below tokenize.max_length"),
        ({"max_position_embeddings": 256}, "the draft must cover the context"),
        ({"warmup_steps": 500, "total_steps": 100}, "train.warmup_steps (500) exceeds train.total_steps"),
    ],
)
def test_train_settings_that_cannot_work_are_refused(train, expected):
    with pytest.raises(ConfigError) as info:
        TrainSettings.of(validated(**train))
    assert expected in str(info.value)


def test_every_problem_is_reported_at_once():
    with pytest.raises(ConfigError) as info:
        TrainSettings.of(validated(batch_tokens=256, warmup_steps=500, total_steps=100))
    assert "train.batch_tokens" in str(info.value) and "train.warmup_steps" in str(info.value)


def test_derived_values():
    settings = TrainSettings.of(validated(betas=[0.8, 0.9]))
    assert settings.loop.betas == (0.8, 0.9) and settings.trust_remote_code is True
    assert settings.gpus_held == 0  # on CPU a segment holds no GPU
    cuda = TrainSettings.of(validated(device="cuda", gpus=2, grad_accum=4))
    assert cuda.gpus_held == 2 and cuda.loop.gpus == 2


def test_the_loop_reads_the_whole_train_section():
    """A rank's settings are the train section, key for key (a checkpoint records them)."""
    config = validated()
    assert set(LoopSettings.__dataclass_fields__) == set(config["train"])


def test_a_rank_reads_its_job_back_from_json():
    spec = TrainSpec(
        key="0123456789abcdef",
        hf_dir="/m",
        trust_remote_code=False,
        hidden_dir="/h",
        assignment="/h/assignment.json",
        vocab="/v.safetensors",
        train=TrainSettings.of(validated()).loop,
    )
    assert TrainSpec.from_json(json.loads(json.dumps(spec.as_json()))) == spec
