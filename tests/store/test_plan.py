"""draftsmith.store.plan and hashing: stage keys move exactly when their semantic inputs do."""

from __future__ import annotations

import copy
import json
import os
import re
from pathlib import Path

import pytest
import yaml

from draftsmith import config as cfg
from draftsmith.fsutil import digests
from draftsmith.store import hashing
from draftsmith.store import keys as stage_keys
from draftsmith.store.hashing import HashCache
from draftsmith.store.plan import SEMANTIC_TRAIN, Plan


def write_dataset(path: Path, prompts: list[str]) -> Path:
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    return path


@pytest.fixture
def sources(tmp_path: Path) -> dict[str, Path]:
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF fake weights")
    return {
        "model": model,
        "chat": write_dataset(tmp_path / "chat.jsonl", ["hello", "how are you"]),
        "code": write_dataset(tmp_path / "code.jsonl", ["write fizzbuzz"]),
        "math": write_dataset(tmp_path / "math.jsonl", ["1+1?", "2*3?"]),
    }


@pytest.fixture
def base(tmp_path: Path, sources: dict[str, Path]) -> dict:
    """A raw (unvalidated) config over the small files in tmp_path."""
    return {
        "experiment": "keys",
        "artifacts_dir": str(tmp_path / "artifacts"),
        "model": {"source": {"kind": "gguf", "path": str(sources["model"])}},
        "datasets": {
            name: {"path": str(sources[name]), "format": "prompt"} for name in ("chat", "code", "math")
        },
        "evaluate": {"enabled": False},
    }


@pytest.fixture
def plan_of(tmp_path: Path):
    def make(raw: dict, cache: Path | None = None) -> Plan:
        config = cfg.validate(copy.deepcopy(raw))
        return Plan(config, HashCache(cache or tmp_path / "cache.json"))

    return make


def all_keys(plan: Plan) -> dict:
    return {
        "model": plan.model.key,
        "responses": {n: a.key for n, a in plan.responses.items()},
        "tokens": {n: a.key for n, a in plan.tokens.items()},
        "merged": plan.merged.key,
    }


def test_keys_are_stable_across_plans_and_caches(tmp_path, base, plan_of):
    first = all_keys(plan_of(base))
    assert all_keys(plan_of(base)) == first
    # A fresh cache hashes from scratch and must land on the same keys.
    assert all_keys(plan_of(base, cache=tmp_path / "other-cache.json")) == first
    assert len(first["model"]) == hashing.KEY_LENGTH
    assert set(first["responses"]) == set(first["tokens"]) == {"chat", "code", "math"}
    every = [first["model"], first["merged"], *first["responses"].values(), *first["tokens"].values()]
    assert len(set(every)) == len(every)


def test_merge_seed_changes_only_merged_key(base, plan_of):
    before = all_keys(plan_of(base))
    base["merge"] = {"seed": 1}
    after = all_keys(plan_of(base))
    assert after["merged"] != before["merged"]
    assert {k: v for k, v in after.items() if k != "merged"} == {
        k: v for k, v in before.items() if k != "merged"
    }


def test_merge_caps_change_only_merged_key(base, plan_of):
    before = all_keys(plan_of(base))
    base["merge"] = {"caps": {"chat": 1}}
    after = all_keys(plan_of(base))
    assert after["merged"] != before["merged"]
    assert after["responses"] == before["responses"] and after["tokens"] == before["tokens"]


def test_adding_a_dataset_leaves_the_others_alone(tmp_path, base, plan_of):
    before = all_keys(plan_of(base))
    base["datasets"]["poems"] = {
        "path": str(write_dataset(tmp_path / "poems.jsonl", ["a haiku"])),
        "format": "prompt",
    }
    after = all_keys(plan_of(base))
    assert after["model"] == before["model"]
    assert set(after["responses"]) == set(after["tokens"]) == {"chat", "code", "math", "poems"}
    for name in ("chat", "code", "math"):
        assert after["responses"][name] == before["responses"][name]
        assert after["tokens"][name] == before["tokens"][name]
    assert after["merged"] != before["merged"]


def test_excluding_a_dataset_changes_only_merged_key(base, plan_of):
    before = all_keys(plan_of(base))
    base["merge"] = {"exclude": ["code"], "caps": {"code": 5}}
    plan = plan_of(base)
    after = all_keys(plan)
    assert after["responses"] == before["responses"] and after["tokens"] == before["tokens"]
    assert after["merged"] != before["merged"]
    assert plan.merged_datasets == ["chat", "math"]
    assert plan.merge_caps() == {}  # caps of an excluded dataset do not count


def test_a_role_map_and_a_regeneration_mode_move_only_their_datasets_keys(base, plan_of):
    base["datasets"]["chat"]["format"] = "sharegpt"
    before = all_keys(plan_of(base))
    base["datasets"]["chat"]["roles"] = {}  # the default: keys as before role maps
    assert all_keys(plan_of(base)) == before
    base["datasets"]["chat"]["roles"] = {"observation": "tool", "function_call": "tool_call"}
    after = all_keys(plan_of(base))
    assert after["responses"]["chat"] != before["responses"]["chat"]
    assert {n: k for n, k in after["responses"].items() if n != "chat"} == {
        n: k for n, k in before["responses"].items() if n != "chat"
    }
    base["datasets"]["chat"]["roles"] = {}
    base["datasets"]["chat"]["regenerate"] = "every_turn"
    assert all_keys(plan_of(base))["responses"]["chat"] not in (
        before["responses"]["chat"],
        after["responses"]["chat"],
    )
    base["datasets"]["chat"]["roles"] = {"observation": "robot"}
    with pytest.raises(cfg.ConfigError, match="robot"):
        plan_of(base)


def test_disabled_dataset_gets_no_keys(base, plan_of):
    before = all_keys(plan_of(base))
    base["datasets"]["code"]["enabled"] = False
    after = all_keys(plan_of(base))
    assert set(after["responses"]) == {"chat", "math"}
    assert after["responses"]["chat"] == before["responses"]["chat"]
    assert after["merged"] != before["merged"]


def test_dataset_content_change_moves_that_dataset_only(sources, base, plan_of):
    before = all_keys(plan_of(base))
    write_dataset(sources["code"], ["write fizzbuzz in rust"])
    after = all_keys(plan_of(base))
    assert after["model"] == before["model"]
    assert after["responses"]["code"] != before["responses"]["code"]
    assert after["tokens"]["code"] != before["tokens"]["code"]
    assert after["merged"] != before["merged"]
    for name in ("chat", "math"):
        assert after["responses"][name] == before["responses"][name]
        assert after["tokens"][name] == before["tokens"][name]


def test_dataset_path_is_not_part_of_the_key(tmp_path, sources, base, plan_of):
    before = all_keys(plan_of(base))
    moved = tmp_path / "elsewhere" / "chat.jsonl"
    moved.parent.mkdir()
    os.replace(sources["chat"], moved)
    base["datasets"]["chat"]["path"] = str(moved)
    assert all_keys(plan_of(base)) == before


def test_model_content_change_moves_everything(sources, base, plan_of):
    before = all_keys(plan_of(base))
    sources["model"].write_bytes(b"GGUF other weights")
    after = all_keys(plan_of(base))
    assert after["model"] != before["model"]
    for name in ("chat", "code", "math"):
        assert after["responses"][name] != before["responses"][name]
        assert after["tokens"][name] != before["tokens"][name]
    assert after["merged"] != before["merged"]


@pytest.mark.parametrize(
    ("section", "field", "value"),
    [
        ("hf", "batch_size", 1),
        ("hf", "device", "cuda"),
        ("openai", "concurrency", 64),
        ("openai", "timeout_s", 5),
        ("openai", "max_retries", 0),
        ("openai", "price_per_million_output", 2.5),
        ("sglang", "tp_size", 4),
    ],
)
def test_performance_settings_change_no_key(base, plan_of, section, field, value):
    before = all_keys(plan_of(base))
    base["generation"] = {section: {field: value}}
    assert all_keys(plan_of(base)) == before


def test_performance_settings_change_no_key_with_openai_backend(base, plan_of):
    base["generation"] = {"backend": "openai", "openai": {"model": "served"}}
    before = all_keys(plan_of(base))
    base["generation"]["openai"].update(concurrency=99, timeout_s=1, budget_usd=3.0)
    assert all_keys(plan_of(base)) == before


def test_max_new_tokens_changes_every_response_key(base, plan_of):
    before = all_keys(plan_of(base))
    base["generation"] = {"max_new_tokens": 17}
    after = all_keys(plan_of(base))
    assert after["model"] == before["model"]
    for name in ("chat", "code", "math"):
        assert after["responses"][name] != before["responses"][name]
        assert after["tokens"][name] != before["tokens"][name]
    assert after["merged"] != before["merged"]


def test_per_dataset_generation_override_moves_that_dataset_only(base, plan_of):
    before = all_keys(plan_of(base))
    base["datasets"]["math"]["generation"] = {"temperature": 0.7}
    after = all_keys(plan_of(base))
    assert after["responses"]["math"] != before["responses"]["math"]
    assert after["responses"]["chat"] == before["responses"]["chat"]
    assert after["responses"]["code"] == before["responses"]["code"]


def test_served_model_counts_only_for_server_backends(base, plan_of):
    before = all_keys(plan_of(base))
    base["generation"] = {"openai": {"model": "a"}}
    assert all_keys(plan_of(base)) == before  # hf backend ignores the served name
    base["generation"] = {"backend": "openai", "openai": {"model": "a"}}
    served_a = all_keys(plan_of(base))
    base["generation"]["openai"]["model"] = "b"
    served_b = all_keys(plan_of(base))
    assert served_a["responses"]["chat"] != before["responses"]["chat"]
    assert served_a["responses"]["chat"] != served_b["responses"]["chat"]


def test_hf_generation_dtype_moves_responses_when_it_differs_from_the_model(base, plan_of):
    before = all_keys(plan_of(base))  # model.dtype defaults to float32
    base["generation"] = {"hf": {"dtype": "float32"}}
    assert all_keys(plan_of(base)) == before  # the same precision as before: same output
    base["generation"] = {"hf": {"dtype": "bfloat16"}}
    after = all_keys(plan_of(base))
    assert after["model"] == before["model"]
    assert all(after["responses"][n] != before["responses"][n] for n in ("chat", "code", "math"))
    base["generation"]["backend"] = "openai"  # a server picks its own precision
    served = all_keys(plan_of(base))
    base["generation"]["hf"]["dtype"] = "float16"
    assert all_keys(plan_of(base)) == served


def test_tokenize_max_length_changes_tokens_not_responses(base, plan_of):
    before = all_keys(plan_of(base))
    base["tokenize"] = {"max_length": 64}
    after = all_keys(plan_of(base))
    assert after["responses"] == before["responses"]
    assert all(after["tokens"][n] != before["tokens"][n] for n in before["tokens"])
    assert after["merged"] != before["merged"]


def test_stage_version_bump_invalidates_that_stage_and_downstream(monkeypatch, base, plan_of):
    before = all_keys(plan_of(base))
    monkeypatch.setitem(stage_keys.STAGE_VERSIONS, "tokens", stage_keys.STAGE_VERSIONS["tokens"] + 1)
    after = all_keys(plan_of(base))
    assert after["model"] == before["model"]
    assert after["responses"] == before["responses"]
    assert all(after["tokens"][n] != before["tokens"][n] for n in before["tokens"])
    assert after["merged"] != before["merged"]


def test_configs_differing_in_seed_share_all_but_merged_dir(base, plan_of):
    one = plan_of(base)
    base["merge"] = {"seed": 7}
    other = plan_of(base)
    assert one.model.directory == other.model.directory
    for name in ("chat", "code", "math"):
        assert one.responses[name].directory == other.responses[name].directory
        assert one.tokens[name].directory == other.tokens[name].directory
    assert one.merged.directory != other.merged.directory
    root = Path(base["artifacts_dir"])
    assert one.responses["chat"].directory == root / "responses" / "chat" / one.responses["chat"].key
    assert one.tokens["chat"].directory == root / "tokens" / "chat" / one.tokens["chat"].key
    assert one.merged.directory == root / "merged" / one.merged.key
    assert one.model.directory == root / "model" / one.model.key


def test_missing_dataset_file_warns_and_plans_a_placeholder(tmp_path, sources, base, plan_of, capsys):
    present = all_keys(plan_of(base))
    sources["math"].unlink()
    capsys.readouterr()
    plan = plan_of(base)
    assert re.search(r"draftsmith: source not found: .*math\.jsonl", capsys.readouterr().err)
    assert plan.missing_sources == [str(sources["math"])]
    assert len(plan.responses["math"].key) == hashing.KEY_LENGTH
    assert plan.responses["math"].key != present["responses"]["math"]
    assert plan.responses["chat"].key == present["responses"]["chat"]
    # Once the file shows up, its real content decides the key again.
    write_dataset(sources["math"], ["1+1?", "2*3?"])
    assert all_keys(plan_of(base)) == present
    assert "source not found" not in capsys.readouterr().err


def test_missing_model_file_warns(sources, base, plan_of, capsys):
    sources["model"].unlink()
    plan = plan_of(base)
    assert re.search(r"source not found: .*model\.gguf", capsys.readouterr().err)
    assert len(plan.model.key) == hashing.KEY_LENGTH


def test_given_gguf_sha256_is_trusted_without_hashing(sources, base, plan_of):
    base["model"]["source"]["sha256"] = "a" * 64
    before = plan_of(base).model.key
    sources["model"].write_bytes(b"different bytes")
    assert plan_of(base).model.key == before
    base["model"]["source"]["sha256"] = "b" * 64
    assert plan_of(base).model.key != before


def test_hf_dir_fingerprint_hashes_metadata_and_stats_weights(tmp_path, base, plan_of):
    model = tmp_path / "hf"
    model.mkdir()
    (model / "config.json").write_text('{"hidden_size": 8}')
    (model / "model.safetensors").write_bytes(b"\0" * 32)
    base["model"]["source"] = {"kind": "hf_dir", "path": str(model)}
    first = plan_of(base).model.key
    (model / "model.safetensors").write_bytes(b"\1" * 32)  # same size: weights are only stat'ed
    assert plan_of(base).model.key == first
    (model / "model.safetensors").write_bytes(b"\1" * 33)
    second = plan_of(base).model.key
    assert second != first
    (model / "config.json").write_text('{"hidden_size": 16}')
    assert plan_of(base).model.key != second


# --- HashCache -----------------------------------------------------------------
@pytest.fixture
def hash_calls(monkeypatch) -> list[str]:
    calls: list[str] = []
    real = hashing.sha256_file

    def counting(path):
        calls.append(str(path))
        return real(path)

    monkeypatch.setattr(hashing, "sha256_file", counting)
    return calls


def test_hash_cache_hashes_once_while_untouched(tmp_path, hash_calls):
    data = tmp_path / "data.bin"
    data.write_bytes(b"x" * 100)
    cache = HashCache(tmp_path / "cache.json")
    digest = cache.sha256(data)
    assert digest == digests.sha256_bytes(b"x" * 100)
    assert cache.sha256(data) == digest
    assert len(hash_calls) == 1
    cache.save()
    # A new cache loaded from the saved file trusts the stored entry.
    reloaded = HashCache(tmp_path / "cache.json")
    assert reloaded.sha256(data) == digest
    assert len(hash_calls) == 1
    stored = json.loads((tmp_path / "cache.json").read_text())
    assert stored[str(data.resolve())]["sha256"] == digest


def test_hash_cache_rehashes_a_changed_file(tmp_path, hash_calls):
    data = tmp_path / "data.bin"
    data.write_bytes(b"first")
    cache = HashCache(tmp_path / "cache.json")
    first = cache.sha256(data)
    cache.save()
    # Same size, new content: the mtime moves, so the stamp no longer matches.
    data.write_bytes(b"secnd")
    stat = data.stat()
    os.utime(data, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    reloaded = HashCache(tmp_path / "cache.json")
    second = reloaded.sha256(data)
    assert second == digests.sha256_bytes(b"secnd") != first
    assert len(hash_calls) == 2
    # A size change alone is enough too.
    data.write_bytes(b"longer content")
    assert reloaded.sha256(data) == digests.sha256_bytes(b"longer content")
    assert len(hash_calls) == 3


def test_plan_hashes_each_source_once_across_dry_runs(tmp_path, base, plan_of, hash_calls):
    plan_of(base)
    # model + three datasets, each hashed once even though planning reads them again.
    assert len(hash_calls) == 4
    assert (tmp_path / "cache.json").exists()
    plan_of(base)
    assert len(hash_calls) == 4


def test_hash_cache_survives_a_corrupt_cache_file(tmp_path):
    (tmp_path / "cache.json").write_text("{not json")
    data = tmp_path / "data.bin"
    data.write_bytes(b"abc")
    cache = HashCache(tmp_path / "cache.json")
    assert cache.sha256(data) == digests.sha256_bytes(b"abc")
    cache.save()
    assert json.loads((tmp_path / "cache.json").read_text())[str(data.resolve())]["sha256"]


def test_tree_sha256_depends_on_names_and_contents(tmp_path):
    root = tmp_path / "tree"
    (root / "sub").mkdir(parents=True)
    (root / "a.txt").write_text("a")
    (root / "sub" / "b.txt").write_text("b")
    cache = HashCache(tmp_path / "cache.json")
    first = cache.tree_sha256(root)
    assert HashCache(tmp_path / "other.json").tree_sha256(root) == first
    (root / "sub" / "b.txt").rename(root / "sub" / "c.txt")
    renamed = cache.tree_sha256(root)
    assert renamed != first
    (root / "sub" / "c.txt").write_text("changed")
    assert cache.tree_sha256(root) != renamed


def train_keys(plan: Plan) -> dict:
    return {"hidden": plan.hidden.key, "draft_vocab": plan.vocab.key, "draft": plan.train.key}


def test_the_states_store_is_keyed_by_what_determines_a_samples_states(base, plan_of):
    plan = plan_of(base)
    store = plan.states.key
    assert plan.states.directory.parent == plan.hidden.directory.parent  # one stage word: hidden
    for section, change in [
        ("merge", {"seed": 5}),
        ("merge", {"caps": {"math": 1}}),
        ("extract", {"num_shards": 9}),
        ("experiment", "renamed"),
        ("datasets", {k: v for k, v in base["datasets"].items() if k != "math"}),
    ]:
        changed = copy.deepcopy(base)
        changed[section] = change
        assert plan_of(changed).states.key == store, section
    for setting in (
        {"storage": "fp8"},
        {"dtype": "bfloat16"},
        {"aux_layers": {"convention": "output_of_layer", "ids": [1, 2, 3]}},
        {"backend": "sglang"},
    ):
        changed = copy.deepcopy(base)
        changed["extract"] = setting
        assert plan_of(changed).states.key != store, setting


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("ttt_steps", 5),
        ("max_position_embeddings", 16384),
        ("lr", 3.0e-4),
        ("betas", [0.9, 0.99]),
        ("weight_decay", 0.01),
        ("warmup_steps", 3),
        ("total_steps", 500),
        ("grad_clip", None),
        ("grad_accum", 4),
        ("batch_tokens", 8192),
        ("checkpoint_every", 7),
        ("seed", 3),
        ("dtype", "bfloat16"),
    ],
)
def test_training_settings_move_only_the_draft_key(base, plan_of, field, value):
    before = train_keys(plan_of(base))
    base["train"] = {field: value}
    after = train_keys(plan_of(base))
    assert after["draft"] != before["draft"]
    assert after["hidden"] == before["hidden"] and after["draft_vocab"] == before["draft_vocab"]


def test_every_training_setting_but_placement_is_in_the_draft_key():
    schema = yaml.safe_load(cfg.SCHEMA_PATH.read_text())
    settings = set(schema["properties"]["train"]["properties"])
    assert settings - {"device", "gpus"} == set(SEMANTIC_TRAIN)


@pytest.mark.parametrize("field", ["draft_vocab_size", "val_fraction"])
def test_vocabulary_settings_move_vocab_and_draft(base, plan_of, field):
    before = train_keys(plan_of(base))
    base["train"] = {field: {"draft_vocab_size": 1000, "val_fraction": 0.1}[field]}
    after = train_keys(plan_of(base))
    assert after["draft_vocab"] != before["draft_vocab"] and after["draft"] != before["draft"]
    assert after["hidden"] == before["hidden"]


def test_device_and_world_size_change_no_key(base, plan_of):
    base["train"] = {"grad_accum": 4}
    before = train_keys(plan_of(base))
    base["train"].update(device="cuda", gpus=4)
    assert train_keys(plan_of(base)) == before


def test_upstream_data_moves_vocab_and_draft(base, plan_of):
    before = train_keys(plan_of(base))
    base["merge"] = {"seed": 5}
    after = train_keys(plan_of(base))
    assert all(after[k] != before[k] for k in before)
    base["merge"] = {"seed": 0}
    base["extract"] = {"num_shards": 9}  # how new states are cut into shards changes no key
    assert train_keys(plan_of(base)) == before
    base["extract"] = {"storage": "fp8"}  # other states: the draft trains on other data
    moved = train_keys(plan_of(base))
    assert moved["draft_vocab"] == before["draft_vocab"]  # the vocabulary reads the merged data, not shards
    assert moved["hidden"] != before["hidden"] and moved["draft"] != before["draft"]


def test_segments_are_fixed_by_config(base, plan_of):
    base["train"] = {"total_steps": 10, "checkpoint_every": 4}
    plan = plan_of(base)
    assert plan.num_segments == 3 and plan.segment_names == ["00000", "00001", "00002"]
    assert plan.checkpoint(2) == plan.train.directory / "ckpt-00002.pt"
    assert plan.metrics(0) == plan.train.directory / "metrics-00000.jsonl"
    assert plan.train.directory == Path(base["artifacts_dir"]) / "train" / plan.train.key
    assert plan.vocab.directory == Path(base["artifacts_dir"]) / "vocab" / plan.vocab.key


def late_keys(plan: Plan) -> dict[str, str]:
    return {"draft": plan.train.key, "export": plan.export.key, "eval": plan.evaluate.key}


@pytest.mark.parametrize(
    ("section", "field", "value"),
    [
        ("evaluate", "k", [1, 3]),
        ("evaluate", "trees", [{"num_steps": 2, "topk": 2, "num_draft_tokens": 5}]),
        ("evaluate", "trees", []),  # trees off
        ("evaluate", "max_new_tokens", 32),
        ("evaluate", "device", "cuda"),  # tokens/s are part of the result
        ("evaluate", "dtype", "bfloat16"),
    ],
)
def test_evaluation_settings_move_only_the_eval_key(base, plan_of, section, field, value):
    before = late_keys(plan_of(base))
    base[section] = {**base.get(section, {}), field: value}
    after = late_keys(plan_of(base))
    assert after["eval"] != before["eval"]
    assert after["draft"] == before["draft"] and after["export"] == before["export"]


def test_export_settings_move_export_and_eval(base, plan_of):
    before = late_keys(plan_of(base))
    base["export"] = {"dtype": "float32"}
    after = late_keys(plan_of(base))
    assert after["draft"] == before["draft"]
    assert after["export"] != before["export"] and after["eval"] != before["eval"]


def test_eval_prompt_set_content_moves_the_eval_key(tmp_path, base, plan_of):
    held = write_dataset(tmp_path / "held.jsonl", ["a held-out prompt"])
    base["evaluate"] = {"prompt_sets": {"held": {"path": str(held)}}}
    before = late_keys(plan_of(base))
    write_dataset(held, ["another held-out prompt"])
    os.utime(held, ns=(1, 1))  # a new mtime: the hash cache rereads the file
    after = late_keys(plan_of(base))
    assert after["eval"] != before["eval"] and after["export"] == before["export"]


def test_a_stage_rename_changes_no_key(base, plan_of):
    """Keys hash each stage's word from before the renames (keys.HASHED_NAMES), so a store
    built then is reused: every key equals the hash of the old names, params and labels."""
    plan = plan_of(base)
    old = {"vocab": "draft_vocab", "train": "draft", "evaluate": "eval"}
    for artifact in plan.artifacts:
        payload = {
            "stage": old.get(artifact.stage, artifact.stage),
            "version": stage_keys.STAGE_VERSIONS[artifact.stage],
            "params": artifact.params,
            "upstream": {old.get(label, label): key for label, key in artifact.upstream.items()},
        }
        assert hashing.derive_key(payload) == artifact.key, artifact.stage
    assert plan.export.upstream == {"train": plan.train.key}  # labelled with today's words


def test_manifest_params_are_the_keys_params(base, plan_of, tmp_path):
    """A manifest records exactly what its key hashed: it is written from the Artifact."""
    from draftsmith.fsutil import atomic
    from draftsmith.store import manifest

    plan = plan_of(base)
    artifact = plan.tokens["chat"]
    atomic.write_text(artifact.path("tokens"), "{}\n")
    written = manifest.write(artifact, artifact.manifest, [artifact.path("tokens")], {}, 0.0)
    assert (written["params"], written["upstream"]) == (artifact.params, artifact.upstream)
    payload = {
        "stage": "tokens",
        "version": stage_keys.STAGE_VERSIONS["tokens"],
        "params": written["params"],
        "upstream": written["upstream"],
    }
    assert hashing.derive_key(payload) == written["key"] == artifact.key


def test_a_job_whose_outputs_lie_under_a_key_no_longer_planned_is_refused(tmp_path):
    """A dataset edited after Snakemake planned the job: the job re-plans, finds that its
    declared outputs are under the old key, and refuses before writing anything."""
    from conftest import stand_in_config

    from draftsmith.errors import InputChangedError
    from draftsmith.store.plan import check_planned, plan_for

    config = cfg.validate(stand_in_config(tmp_path))
    before = plan_for(config).responses["chat"]
    check_planned(plan_for(config), list(before.outputs.values()))  # unchanged: fine
    Path(config["datasets"]["chat"]["path"]).write_text('{"prompt": "another prompt"}\n')
    after = plan_for(config)
    with pytest.raises(InputChangedError) as err:
        check_planned(after, list(before.outputs.values()))
    message = str(err.value)
    assert before.key in message and after.responses["chat"].key in message
    assert after.responses["chat"].params["source"] in message
    # Outputs outside the store (results/, logs) are not keyed and not checked.
    check_planned(after, [str(tmp_path / "results" / "test" / "benchmark.md")])
