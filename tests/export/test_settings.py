"""ExportSettings: the export's settings as the job reads them."""

from __future__ import annotations

from draftsmith import config as cfg
from draftsmith.export.settings import ExportSettings
from draftsmith.store.plan import plan_for


def _config(**sections) -> dict:
    return cfg.validate(
        {
            "experiment": "x",
            "model": {"source": {"kind": "gguf", "path": "m.gguf"}},
            "datasets": {"a": {"path": "a.jsonl", "format": "prompt"}},
            "evaluate": {"enabled": False},
            **sections,
        }
    )


def test_the_serving_context_falls_back_to_the_trained_positions():
    assert ExportSettings.of(_config(train={"max_position_embeddings": 4096})).serving_context == 4096
    settings = ExportSettings.of(_config(export={"serving_context": 8192, "dtype": "float16"}))
    assert settings.serving_context == 8192 and settings.dtype == "float16"
    assert settings.verifier_name_or_path is None and settings.trust_remote_code is False


def test_the_settings_agree_with_what_the_export_key_holds(tmp_path):
    config = _config(artifacts_dir=str(tmp_path), export={"speculative_tokens": 5})
    settings, params = ExportSettings.of(config), plan_for(config).export.params
    for name in ("dtype", "serving_context", "speculative_tokens", "verifier_name_or_path"):
        assert getattr(settings, name) == params[name], name
    assert settings.allow_ambiguous_sglang_ids == params["allow_ambiguous_sglang_ids"]
