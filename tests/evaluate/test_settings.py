"""EvaluateSettings: the evaluator's settings as the job reads them, checked as they are built."""

from __future__ import annotations

import pytest

from draftsmith import config as cfg
from draftsmith.errors import ConfigError
from draftsmith.evaluate.settings import EvaluateSettings, PromptSetEntry
from draftsmith.speculation import Speculation


def _config(evaluate: dict | None = None, **sections) -> dict:
    return cfg.validate(
        {
            "experiment": "x",
            "model": {"source": {"kind": "gguf", "path": "m.gguf"}},
            "datasets": {"a": {"path": "a.jsonl", "format": "prompt"}},
            "evaluate": {
                "prompt_sets": {"b": {"path": "b.jsonl"}, "a": {"path": "a.jsonl"}},
                **(evaluate or {}),
            },
            **sections,
        }
    )


def test_chains_trees_and_prompt_sets_come_out_in_their_order():
    tree = {"num_steps": 3, "topk": 2, "num_draft_tokens": 6}
    settings = EvaluateSettings.of(_config({"k": [3, 1], "trees": [tree]}))
    assert settings.chains == (Speculation(3, 1, 4), Speculation(1, 1, 2))
    assert settings.measured == (*settings.chains, Speculation(3, 2, 6))
    assert [entry.name for entry in settings.prompt_sets] == ["a", "b"]
    assert settings.prompt_sets[1] == PromptSetEntry("b", "b.jsonl", "prompt", "prompt", None)
    assert settings.gpus == 0  # evaluate.device cpu


def test_the_recommended_launch_serves_the_exported_context():
    trained = _config(train={"max_position_embeddings": 4096})
    assert EvaluateSettings.of(trained).launch_context == 4096  # export.serving_context unset
    served = _config(train={"max_position_embeddings": 4096}, export={"serving_context": 8192})
    assert EvaluateSettings.of(served).launch_context == 8192
    # The serving benchmark's launch settings are that stage's, not the evaluator's.
    bench = {"serve_benchmark": {"sglang": {"context_length": 2048, "tp_size": 4}}}
    assert EvaluateSettings.of(_config(**bench)) == EvaluateSettings.of(_config())


@pytest.mark.parametrize(
    ("evaluate", "message"),
    [
        ({"length_buckets": [64, 16]}, r"^evaluate.length_buckets: upper bounds must be strictly ascending"),
        (
            {
                "trees": [
                    {"num_steps": 2, "topk": 2, "num_draft_tokens": 4},
                    {"num_steps": 3, "topk": 1, "num_draft_tokens": 3},
                ]
            },
            r"^evaluate.trees\[1\]: topk 1 is a chain",
        ),
    ],
)
def test_bad_settings_are_refused_naming_the_key(evaluate, message):
    with pytest.raises(ConfigError, match=message):
        EvaluateSettings.of(_config(evaluate))
