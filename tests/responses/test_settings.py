"""The responses stage's settings, per dataset: the dataset's entry and generation overrides
resolved, the backend's own section, and the SGLang launch refused before any job runs."""

from __future__ import annotations

import pytest
from conftest import stand_in_config

from draftsmith import config as cfg
from draftsmith.errors import ConfigError
from draftsmith.responses.settings import ResponsesSettings
from draftsmith.workflow import configure


def test_a_dataset_reads_its_overrides_over_the_shared_settings(tmp_path):
    config = stand_in_config(tmp_path)
    config["generation"].update(temperature=0.5, system_prompt="Be brief.")
    config["generation"]["hf"]["dtype"] = "bfloat16"
    config["dataset_defaults"] = {"max_prompt_tokens": 100}
    config["datasets"]["code"].update(
        max_bad_fraction=0.5, generation={"max_new_tokens": 3, "system_prompt": None, "backend": "openai"}
    )
    settings = configure(config).responses
    assert set(settings) == {"chat", "code"}
    chat, code = settings["chat"], settings["code"]
    assert (chat.sampling.max_new_tokens, chat.sampling.temperature) == (12, 0.5)
    assert (code.sampling.max_new_tokens, code.sampling.temperature) == (3, 0.5)
    assert (chat.source.system_prompt, code.source.system_prompt) == ("Be brief.", None)
    assert (chat.source.max_prompt_tokens, chat.source.max_bad_fraction) == (100, 0.05)
    assert code.source.max_bad_fraction == 0.5
    # The chosen backend's section only; generation.hf.dtype over model.dtype.
    assert chat.backend == "hf" and chat.hf.dtype == "bfloat16" and chat.hf.batch_size == 8
    assert chat.sglang is None and chat.gpus == 0
    assert code.backend == "openai" and code.hf is None and code.sglang is None


def test_the_loader_reads_the_entry_as_resolved(tmp_path):
    config = cfg.validate(stand_in_config(tmp_path))
    config["datasets"]["chat"].update(format="sharegpt", roles={"bot": "assistant"}, max_samples=2)
    entry = ResponsesSettings.of(config, "chat").source.entry()
    resolved = cfg.dataset_settings(config, "chat")
    read = ("path", "format", "prompt_field", "roles", "regenerate", "split", "max_samples")
    assert {k: entry[k] for k in read} == {k: resolved[k] for k in read}
    assert entry["roles"] == {"bot": "assistant"}
    assert entry["generation"] == {"system_prompt": None}


def test_extra_body_stays_frozen_and_is_sent_as_given(tmp_path):
    config = stand_in_config(tmp_path)
    config["generation"]["openai"] = {"extra_body": {"top_k": 5, "stop": ["x"]}}
    openai = configure(config).responses["chat"].openai
    fields = openai.extra_fields()
    assert fields == {"top_k": 5, "stop": ["x"]}
    fields["top_k"] = 1  # the settings keep their own copy
    assert openai.extra_fields()["top_k"] == 5


def test_sglang_extra_args_are_refused_at_configure_for_a_dataset_that_uses_it(tmp_path):
    config = stand_in_config(tmp_path)
    config["generation"]["sglang"] = {"extra_args": ["--port", "1"], "gpus": 2}
    configure(config)  # no dataset generates with SGLang: its section is not read
    config["datasets"]["code"]["generation"] = {"backend": "sglang"}
    with pytest.raises(ConfigError, match=r"^config: generation\.sglang\.extra_args: --port duplicates"):
        configure(config)
    config["generation"]["sglang"]["extra_args"] = ["--disable-radix-cache"]
    code = configure(config).responses["code"]
    assert code.sglang.extra_args == ("--disable-radix-cache",) and code.gpus == 2
