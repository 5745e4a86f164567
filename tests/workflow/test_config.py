"""draftsmith.config: the default config validates, and every error names its key path."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import yaml
from conftest import stand_in_config, write_rows

from draftsmith import config as cfg
from draftsmith.errors import ConfigError
from draftsmith.store.plan import plan_for
from draftsmith.workflow import configure

REPO = Path(__file__).resolve().parents[2]
DEFAULT_CONFIG = REPO / "config.yaml"
KINDS = "['pypi', 'gguf', 'hf_dir']"


@pytest.fixture
def raw() -> dict:
    """The default config as written (defaults not yet filled)."""
    return yaml.safe_load(DEFAULT_CONFIG.read_text())


def error_of(config: dict) -> str:
    with pytest.raises(ConfigError) as info:
        cfg.validate(config)
    return str(info.value)


def test_default_config_loads_and_fills_defaults():
    config = cfg.load(DEFAULT_CONFIG)
    assert config["experiment"] == "demo"
    # Whole sections absent from config.yaml come from the schema...
    assert config["generation"]["openai"]["concurrency"] == 8
    assert config["generation"]["openai"]["model"] is None
    assert config["generation"]["sglang"]["port"] == 30000
    assert config["generation"]["sglang"]["extra_args"] == []
    assert config["dataset_defaults"] == {
        "max_bad_fraction": 0.05,
        "max_prompt_tokens": 4096,
        "min_supervised_share": 0.01,
    }
    assert config["merge"]["exclude"] == []
    assert config["merge"]["caps"] == {}
    # ...as do absent fields of sections that are present, while given values win.
    assert config["generation"]["hf"] == {
        "device": "cpu",
        "batch_size": 32,
        "dtype": None,
        "attention": "sdpa",
    }
    assert config["generation"]["top_p"] == 1.0
    assert config["generation"]["max_new_tokens"] == 64
    assert config["tokenize"] == {"max_length": 512, "max_roundtrip_mismatch": 1.0}
    assert config["datasets"]["chat"]["enabled"] is True
    assert config["datasets"]["chat"]["split"] is None
    assert config["datasets"]["chat"]["prompt_field"] == "prompt"
    assert config["model"]["trust_remote_code"] is False


def test_minimal_config_gets_every_section():
    config = cfg.validate(
        {
            "experiment": "x",
            "model": {"source": {"kind": "gguf", "path": "m.gguf"}},
            "datasets": {"a": {"path": "a.jsonl", "format": "prompt"}},
            "evaluate": {"enabled": False},
        }
    )
    assert config["artifacts_dir"] == "artifacts"
    assert config["generation"]["backend"] == "hf"
    assert config["generation"]["hf"]["batch_size"] == 16
    assert config["generation"]["openai"]["concurrency"] == 8
    assert config["tokenize"]["max_length"] == 2048
    assert config["merge"]["seed"] == 0
    assert config["model"]["dtype"] == "float32"


def test_validate_does_not_share_default_objects():
    # Mutable defaults are deep-copied, so one config's edits never leak into another.
    first = cfg.load(DEFAULT_CONFIG)
    first["merge"]["exclude"].append("chat")
    first["generation"]["sglang"]["extra_args"].append("--x")
    second = cfg.load(DEFAULT_CONFIG)
    assert second["merge"]["exclude"] == []
    assert second["generation"]["sglang"]["extra_args"] == []


def test_dataset_settings_resolve_defaults_and_overrides(raw):
    raw["datasets"]["code"]["max_bad_fraction"] = 0.5
    raw["datasets"]["code"]["generation"] = {"max_new_tokens": 7}
    config = cfg.validate(raw)
    code = cfg.dataset_settings(config, "code")
    assert code["max_bad_fraction"] == 0.5
    assert code["max_prompt_tokens"] == 4096
    assert code["generation"]["max_new_tokens"] == 7
    assert code["generation"]["temperature"] == 0.0
    assert "hf" not in code["generation"] and "openai" not in code["generation"]
    chat = cfg.dataset_settings(config, "chat")
    assert chat["max_bad_fraction"] == 0.05
    assert chat["generation"]["max_new_tokens"] == 64


def test_generation_dtype_defaults_to_the_model_dtype(raw):
    assert cfg.generation_dtype(cfg.validate(copy.deepcopy(raw))) == "float32"
    raw["generation"] = {"hf": {"dtype": "bfloat16"}}
    assert cfg.generation_dtype(cfg.validate(copy.deepcopy(raw))) == "bfloat16"
    raw["generation"]["hf"]["dtype"] = "bf16"
    with pytest.raises(ConfigError, match="generation.hf.dtype"):
        cfg.validate(raw)


def test_unknown_top_level_key(raw):
    raw["artefacts_dir"] = "x"
    message = error_of(raw)
    assert "unknown key artefacts_dir" in message
    assert "allowed: artifacts_dir," in message


def test_unknown_nested_key(raw):
    raw["generation"]["hf"]["batchsize"] = 4
    message = error_of(raw)
    assert "unknown key generation.hf.batchsize (allowed: attention, batch_size, device, dtype)" in message


def test_extract_sglang_has_generation_launch_settings_and_refuses_others(raw):
    raw["extract"] = {"backend": "sglang", "sglang": {"tp_size": 8}}
    validated = cfg.validate(copy.deepcopy(raw))
    launch = validated["extract"]["sglang"]
    assert launch["tp_size"] == 8 and launch["port"] == 30000 and launch["request_timeout_s"] == 3600
    assert launch.keys() - {"request_timeout_s"} == validated["generation"]["sglang"].keys()
    raw["extract"]["sglang"]["tp"] = 8
    assert "unknown key extract.sglang.tp" in error_of(raw)


def test_unknown_key_in_dataset_generation_override(raw):
    raw["datasets"]["chat"]["generation"] = {"batch_size": 4}
    message = error_of(raw)
    assert "unknown key datasets.chat.generation.batch_size" in message
    assert "max_new_tokens" in message


def test_wrong_type(raw):
    raw["tokenize"]["max_length"] = "big"
    assert "tokenize.max_length: expected integer, got 'big'" in error_of(raw)


def test_wrong_type_of_nullable_field_names_both_types(raw):
    raw["generation"]["openai"] = {"model": 3}
    assert "generation.openai.model: expected string or null, got 3" in error_of(raw)


def test_below_minimum(raw):
    raw["tokenize"]["max_length"] = 3
    message = error_of(raw)
    assert "tokenize.max_length:" in message
    assert "minimum of 16" in message


def test_missing_required_dataset_field(raw):
    del raw["datasets"]["chat"]["format"]
    assert "datasets.chat: missing field: format" in error_of(raw)


def test_missing_required_top_level_field(raw):
    del raw["datasets"]
    assert "<top level>: missing field: datasets" in error_of(raw)


def test_bad_enum(raw):
    raw["datasets"]["math"]["format"] = "alpaca"
    message = error_of(raw)
    assert "datasets.math.format: expected one of ['prompt', 'sharegpt', 'messages'], got 'alpaca'" in message


def test_bad_backend_enum(raw):
    raw["generation"]["backend"] = "vllm"
    assert "generation.backend: expected one of ['hf', 'openai', 'sglang'], got 'vllm'" in error_of(raw)


def test_bad_dataset_name(raw):
    raw["datasets"]["bad name"] = {"path": "x.jsonl", "format": "prompt"}
    assert "datasets: invalid name 'bad name' (must match" in error_of(raw)


@pytest.mark.parametrize("name", [".", "..", ".hidden", "a/b", "-x", ""])
def test_a_dataset_name_that_is_not_a_plain_word_is_refused(raw, name):
    # "." and ".." would put artifacts, logs and benchmarks beside the stage directories.
    raw["datasets"][name] = {"path": "x.jsonl", "format": "prompt"}
    assert f"datasets: invalid name {name!r} (must match" in error_of(raw)


@pytest.mark.parametrize("name", ["chat", "code_alpaca", "_x", "2024", "v1.2"])
def test_plain_dataset_names_are_accepted_by_schema_and_workflow_alike(raw, name):
    raw["datasets"][name] = {"path": "x.jsonl", "format": "prompt"}
    assert name in cfg.validate(raw)["datasets"]
    assert re.fullmatch(cfg.dataset_name_pattern(), name)
    for bad in (".", "..", ".hidden", "a/b"):
        assert not re.fullmatch(cfg.dataset_name_pattern(), bad)


def test_the_workflow_takes_its_dataset_wildcard_from_the_schema():
    common = (REPO / "rules" / "common.smk").read_text()
    assert re.search(r"^\s*dataset=dataset_name_pattern\(\),$", common, re.MULTILINE)


def test_every_error_is_reported(raw):
    raw["tokenize"]["max_length"] = "big"
    raw["generation"]["hf"]["batchsize"] = 4
    message = error_of(raw)
    assert "tokenize.max_length" in message
    assert "generation.hf.batchsize" in message
    assert message.count("\n  - ") == 2


def test_pypi_source_missing_sha256(raw):
    del raw["model"]["source"]["sha256"]
    message = error_of(raw)
    # Reported against the pypi alternative only, not against gguf/hf_dir.
    assert "model.source: missing field: sha256" in message
    assert "path" not in message


def test_pypi_source_bad_sha256(raw):
    raw["model"]["source"]["sha256"] = "xyz"
    assert "model.source.sha256: 'xyz' does not match ^[0-9a-f]{64}$" in error_of(raw)


def test_source_of_meant_kind_reports_all_its_problems(raw):
    raw["model"]["source"] = {"kind": "gguf", "file": "m.gguf"}
    message = error_of(raw)
    assert "model.source: missing field: path" in message
    assert "unknown key model.source.file (allowed: kind, path, sha256)" in message


def test_unknown_source_kind(raw):
    raw["model"]["source"]["kind"] = "http"
    assert f"model.source.kind: expected one of {KINDS}, got 'http'" in error_of(raw)


def test_source_without_kind(raw):
    del raw["model"]["source"]["kind"]
    assert f"model.source: missing field: kind (one of {KINDS})" in error_of(raw)


def test_source_not_a_mapping(raw):
    raw["model"]["source"] = "model.gguf"
    message = error_of(raw)
    assert f"model.source: expected a mapping with kind one of {KINDS}, got 'model.gguf'" in message


def test_merge_caps_must_be_positive(raw):
    raw["merge"]["caps"] = {"chat": 0}
    assert "merge.caps.chat:" in error_of(raw)


def test_load_names_the_file(tmp_path, raw):
    bad = copy.deepcopy(raw)
    bad["tokenize"]["max_length"] = "big"
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    with pytest.raises(ConfigError, match=r"bad\.yaml: invalid configuration"):
        cfg.load(path)


def test_load_rejects_invalid_yaml_and_non_mappings(tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text("experiment: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        cfg.load(broken)
    listing = tmp_path / "list.yaml"
    listing.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="expected a mapping at the top level"):
        cfg.load(listing)


@pytest.mark.parametrize("path", sorted((REPO / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_configs_validate(path):
    cfg.load(path)


def test_train_section_defaults_and_unknown_keys(raw):
    config = cfg.load(DEFAULT_CONFIG)
    assert config["train"]["draft_vocab_size"] == 4096 and config["train"]["gpus"] == 1
    assert config["train"]["betas"] == [0.9, 0.95] and config["train"]["dtype"] is None
    raw["train"]["learning_rate"] = 1.0e-4
    assert "unknown key train.learning_rate" in error_of(raw)


@pytest.mark.parametrize(
    ("train", "expected"),
    [
        ({"dtype": "float16"}, "train.dtype: expected one of"),
        ({"device": "tpu"}, "train.device: expected one of"),
    ],
)
def test_train_settings_that_cannot_work_are_refused(raw, train, expected):
    raw["train"].update(train)
    assert expected in error_of(raw)


@pytest.mark.parametrize("section", ["generation.hf", "extract"])
def test_an_unknown_device_is_refused(raw, section):
    outer, *inner = section.split(".")
    entry = raw.setdefault(outer, {})
    for key in inner:
        entry = entry.setdefault(key, {})
    entry["device"] = "tpu"
    assert f"{section}.device" in error_of(raw) and "tpu" in error_of(raw)


def test_evaluation_without_prompt_sets_is_refused_before_any_work(raw):
    raw["evaluate"]["prompt_sets"] = {}
    assert "evaluate.prompt_sets: empty while evaluate.enabled is true" in error_of(raw)
    raw["evaluate"]["enabled"] = False
    cfg.validate(raw)


@pytest.mark.parametrize(
    ("switches", "on"),
    [
        ({}, {"evaluate", "search"}),  # the default: the serving benchmark needs GPUs and SGLang
        ({"search": True, "serve_benchmark": True}, {"evaluate", "search", "serve_bench"}),
        ({"search": True, "evaluate": False}, set()),  # the search decodes with the evaluator
    ],
)
def test_one_answer_says_which_stages_run_and_the_plan_builds_them(raw, switches, on):
    cfg.validate(raw)  # defaults filled in, then the switches turned
    for section, enabled in switches.items():
        raw[section]["enabled"] = enabled
    optional = {"evaluate", "search", "serve_bench"}
    assert {stage for stage in optional if cfg.stage_on(raw, stage)} == on
    assert all(cfg.stage_on(raw, stage) for stage in ("model", "train", "export", "report"))
    plan = plan_for(raw)
    assert {a.stage for a in plan.built} & optional == on


def test_evaluate_trees_default_and_bad_trees_are_refused_with_their_key_path(raw, monkeypatch, tmp_path):
    from draftsmith.workflow import configure

    schema_default = copy.deepcopy(raw)
    del schema_default["evaluate"]["trees"]  # config.yaml measures one tree; the schema two
    assert cfg.validate(schema_default)["evaluate"]["trees"] == [
        {"num_steps": 3, "topk": 2, "num_draft_tokens": 6},
        {"num_steps": 4, "topk": 4, "num_draft_tokens": 8},
    ]
    monkeypatch.chdir(REPO)
    raw["artifacts_dir"] = str(tmp_path / "artifacts")
    good = {"num_steps": 2, "topk": 2, "num_draft_tokens": 7}  # 1 + 2 + 2*2 = 7 nodes at most
    for bad, message in [
        ({"num_steps": 2, "topk": 2, "num_draft_tokens": 8}, "num_draft_tokens must be between 2 and 7"),
        ({"num_steps": 3, "topk": 1, "num_draft_tokens": 3}, "topk 1 is a chain, which SGLang runs with"),
    ]:
        raw["evaluate"]["trees"] = [good, bad]
        with pytest.raises(ConfigError, match=rf"^config: evaluate.trees\[1\]: {message}"):
            configure(copy.deepcopy(raw))
    raw["evaluate"]["trees"] = [{"num_steps": 2, "topk": 0, "num_draft_tokens": 4}]
    assert "evaluate.trees.0.topk" in error_of(raw)  # the schema's own bounds
    raw["evaluate"]["trees"] = [good]
    configure(raw)


def test_evaluate_length_buckets_must_ascend_and_are_refused_with_their_key_path(raw, monkeypatch, tmp_path):
    from draftsmith.workflow import configure

    defaults = cfg.load(DEFAULT_CONFIG)["evaluate"]
    assert defaults["length_buckets"] == [512, 2048, 8192] and defaults["long_context_drop"] == 0.8
    monkeypatch.chdir(REPO)
    raw["artifacts_dir"] = str(tmp_path / "artifacts")
    message = r"^config: evaluate.length_buckets: upper bounds must be strictly ascending, got "
    for bad in ([2048, 512], [512, 512]):
        raw["evaluate"]["length_buckets"] = bad
        with pytest.raises(ConfigError, match=message + rf"\[{bad[0]}, {bad[1]}\]$"):
            configure(copy.deepcopy(raw))
    raw["evaluate"]["length_buckets"] = []
    assert "evaluate.length_buckets" in error_of(raw)  # the schema's minItems
    raw["evaluate"]["length_buckets"] = [16, 0]
    assert "evaluate.length_buckets.1" in error_of(raw)
    raw["evaluate"]["length_buckets"] = [16, 64]
    raw["evaluate"]["long_context_drop"] = 1.5
    assert "evaluate.long_context_drop" in error_of(raw)
    raw["evaluate"]["long_context_drop"] = 0.5
    configure(raw)


# --- two datasets reading the same source ----------------------------------------------


def configure_error(config: dict) -> str:
    with pytest.raises(ConfigError) as info:
        configure(config)
    return str(info.value)


def test_two_datasets_reading_the_same_file_are_refused(tmp_path):
    config = stand_in_config(tmp_path)
    config["datasets"]["chat_again"] = dict(config["datasets"]["chat"])
    message = configure_error(config)
    assert "datasets chat, chat_again read the same content" in message
    assert str(tmp_path / "chat.jsonl") in message and "shared_source: true" in message


def test_two_datasets_reading_the_same_content_are_refused(tmp_path):
    config = stand_in_config(tmp_path)
    copy_path = tmp_path / "copy.jsonl"
    copy_path.write_bytes((tmp_path / "code.jsonl").read_bytes())
    config["datasets"]["copied"] = {"path": str(copy_path), "format": "prompt"}
    message = configure_error(config)
    assert "datasets code, copied read the same content" in message
    assert str(copy_path) in message and str(tmp_path / "code.jsonl") in message


def test_a_shared_source_is_accepted_when_each_dataset_says_it_is_meant(tmp_path):
    config = stand_in_config(tmp_path)
    config["datasets"]["warm"] = {**config["datasets"]["chat"], "generation": {"temperature": 0.7}}
    config["datasets"]["warm"]["shared_source"] = True
    assert "shared_source: true" in configure_error(copy.deepcopy(config))  # chat does not say so
    config["datasets"]["chat"]["shared_source"] = True
    plan = configure(config).plan
    assert {"chat", "warm"} <= set(plan.responses)
    assert plan.responses["chat"].key != plan.responses["warm"].key


def test_a_disabled_duplicate_is_not_a_shared_source(tmp_path):
    config = stand_in_config(tmp_path)
    config["datasets"]["old"] = {**config["datasets"]["chat"], "enabled": False}
    assert "old" not in configure(config).plan.responses


def test_the_same_file_read_for_other_prompts_is_not_a_shared_source(tmp_path):
    config = stand_in_config(tmp_path)
    both = write_rows(tmp_path / "both.jsonl", ["a question"])
    config["datasets"] = {
        "asked": {"path": str(both), "format": "prompt"},
        "other": {"path": str(both), "format": "prompt", "prompt_field": "question"},
    }
    assert set(configure(config).plan.responses) == {"asked", "other"}


def test_command_line_values_are_read_as_yaml_and_merged_over_the_config():
    config = {"search": {"enabled": "false", "eta": 2, "first_prompts": 1}, "experiment": "demo"}
    cfg.apply_command_line(config, ["search={enabled: true, eta: 3}", "experiment='007'", "notes="])
    assert config["search"] == {"enabled": True, "eta": 3, "first_prompts": 1}  # the rest is kept
    assert config["experiment"] == "007" and config["notes"] is None
    with pytest.raises(ConfigError, match="--config search: not valid YAML"):
        cfg.apply_command_line(config, ["search={enabled: [}"])


@pytest.mark.slow  # a pip install of the package (no dependencies) into a directory
def test_a_regular_install_ships_the_schema(tmp_path):
    """Not only an editable install: the schema is package data, read from the install."""
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
         "--target", str(target), str(repo)],
        check=True, capture_output=True, cwd=tmp_path,
    )  # fmt: skip
    probe = "from draftsmith import config; print(config.SCHEMA_PATH); print(config.load_schema()['type'])"
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, env={"PYTHONPATH": str(target)},
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    assert Path(out[0]).is_relative_to(target) and out[1] == "object"
