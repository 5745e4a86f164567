"""Draft export for SGLang and vLLM: real drafts, real files, and validation that catches bad ones."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from draftsmith.draft import vocab
from draftsmith.draft.model import DraftConfig, Eagle3Draft
from draftsmith.errors import DraftsmithError
from draftsmith.export.load import load_sglang_export
from draftsmith.export.names import (
    CONFIG_FILE,
    KEY_MAPS,
    MANIFEST_FILE,
    SGLANG,
    VLLM,
    WEIGHTS_FILE,
    ExportError,
    aux_layer_ids,
)
from draftsmith.export.validate import validate_sglang, validate_vllm
from draftsmith.export.write import export_sglang, export_vllm
from draftsmith.fsutil.digests import sha256_file
from draftsmith.target.layers import AuxLayers

H, INTER, HEADS, KV_HEADS, HEAD_DIM, VOCAB, DRAFT_VOCAB, LAYERS = 32, 64, 4, 2, 8, 300, 50, 30
SERVING = 4096
AUX = AuxLayers.default(LAYERS)
LLAMA3_SCALING = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}
THETA = 50000.0
# A Llama 3.1-style config.json: the older form, rope_scaling with rope_theta beside it.
TARGET_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": H,
    "vocab_size": VOCAB,
    "num_hidden_layers": LAYERS,
    "max_position_embeddings": 1024,
    "rope_theta": THETA,
    "rope_scaling": LLAMA3_SCALING,
}


def make_draft(seed: int = 0, **overrides) -> Eagle3Draft:
    torch.manual_seed(seed)
    fields = dict(
        hidden_size=H,
        intermediate_size=INTER,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        vocab_size=VOCAB,
        draft_vocab_size=DRAFT_VOCAB,
        max_position_embeddings=256,
        rope_theta=THETA,
        target_hidden_size=H,
        rope_scaling=LLAMA3_SCALING,  # the target's, as DraftConfig.from_target copies it
    )
    fields.update(overrides)
    cfg = DraftConfig(**fields)
    draft = Eagle3Draft(cfg, torch.randn(cfg.vocab_size, cfg.hidden_size))
    with torch.no_grad():  # norms away from 1 so a swapped or reset norm changes the logits
        for name, param in draft.named_parameters():
            if name.endswith("norm.weight"):
                param.uniform_(0.5, 1.5)
    counts = Counter({t: (t * 7) % 13 + 1 for t in range(0, cfg.vocab_size, 3)})
    mapping = vocab.build(counts, cfg.draft_vocab_size, cfg.vocab_size)
    draft.set_vocab(mapping["d2t"], mapping["t2d"])
    return draft


@pytest.fixture(scope="module")
def draft() -> Eagle3Draft:
    return make_draft()


def do_export(
    fmt: str,
    draft: Eagle3Draft,
    out: Path,
    dtype: str = "float32",
    aux: AuxLayers = AUX,
    target_config: dict = TARGET_CONFIG,
    **kw,
) -> dict:
    if fmt == SGLANG:
        return export_sglang(
            draft, out, aux=aux, target_config=target_config, serving_context=SERVING, dtype=dtype, **kw
        )
    return export_vllm(
        draft,
        out,
        aux=aux,
        target_config=target_config,
        verifier_name_or_path="org/target-model",
        speculative_tokens=3,
        serving_context=SERVING,
        dtype=dtype,
        **kw,
    )


def do_validate(fmt: str, out: Path, draft: Eagle3Draft, dtype: str = "float32") -> dict:
    if fmt == SGLANG:
        return validate_sglang(out, draft, aux=AUX, serving_context=SERVING, dtype=dtype)
    return validate_vllm(out, draft, aux=AUX, serving_context=SERVING, dtype=dtype, speculative_tokens=3)


def rewrite_weights(out: Path, change: Callable[[dict], None]) -> None:
    tensors = load_file(str(out / WEIGHTS_FILE))
    change(tensors)
    save_file(tensors, str(out / WEIGHTS_FILE))


def rewrite_config(out: Path, change: Callable[[dict], None]) -> None:
    config = json.loads((out / CONFIG_FILE).read_text())
    change(config)
    (out / CONFIG_FILE).write_text(json.dumps(config))


def one_step_logits(model: Eagle3Draft, seed: int = 7) -> torch.Tensor:
    """One real draft step on a fixed random input, through the model's own API."""
    gen = torch.Generator().manual_seed(seed)
    t = 5
    aux = torch.randn(1, t, 3 * H, generator=gen)
    ids = torch.randint(0, VOCAB, (1, t), generator=gen)
    with torch.no_grad():
        hidden = model.step(model.embed_tokens(ids), model.fc(aux), torch.arange(t)[None], ([], []))
        return model.logits(hidden)


# --- key maps and layer-id conventions ------------------------------------------------


def test_key_maps_cover_the_draft_exactly(draft):
    names = set(draft.state_dict())
    assert set(KEY_MAPS[VLLM]) == names
    assert set(KEY_MAPS[SGLANG]) == names - {"embed_tokens.weight"}
    assert all(name == key for name, key in KEY_MAPS[SGLANG].items())
    for name, key in KEY_MAPS[VLLM].items():
        expected = "layers.0." + name.removeprefix("midlayer.") if name.startswith("midlayer.") else name
        assert key == expected
    assert not any(key.startswith("model.") for key in KEY_MAPS[VLLM].values())
    assert {"layers.0.hidden_norm.weight", "layers.0.input_layernorm.weight"} <= set(KEY_MAPS[VLLM].values())


def test_layer_ids_in_each_consumers_convention():
    # N=30: output-of [1, N//2-1, N-4] for SGLang's config, input-of [2, N//2, N-3] for vLLM's
    assert aux_layer_ids(SGLANG, AUX) == [1, 14, 26]
    assert aux_layer_ids(VLLM, AUX) == [2, 15, 27]
    shifted = AuxLayers.from_output_of([2, 14, 26], LAYERS)
    with pytest.raises(ExportError, match="start at 2"):
        aux_layer_ids(SGLANG, shifted)
    assert aux_layer_ids(SGLANG, shifted, allow_ambiguous_sglang_ids=True) == [2, 14, 26]
    assert aux_layer_ids(VLLM, shifted) == [3, 15, 27]
    assert issubclass(ExportError, DraftsmithError)


# --- what is written -------------------------------------------------------------------


def test_sglang_export_files_and_config(draft, tmp_path):
    out = tmp_path / "sglang"
    manifest = do_export(SGLANG, draft, out, dtype="bfloat16")
    assert sorted(p.name for p in out.iterdir()) == sorted([CONFIG_FILE, WEIGHTS_FILE, MANIFEST_FILE])
    assert [p.name for p in tmp_path.iterdir()] == ["sglang"]  # no temp dirs left
    with safe_open(str(out / WEIGHTS_FILE), "pt") as f:
        keys = set(f.keys())
    assert keys == set(KEY_MAPS[SGLANG].values())
    assert not any(k.startswith("layers.") or "embed_tokens" in k for k in keys)
    tensors = load_file(str(out / WEIGHTS_FILE))
    assert tensors["d2t"].dtype == torch.int64 and tensors["t2d"].dtype == torch.bool
    assert {t.dtype for k, t in tensors.items() if k not in ("d2t", "t2d")} == {torch.bfloat16}
    assert tensors["lm_head.weight"].shape == (DRAFT_VOCAB, H)
    assert tensors["fc.weight"].shape == (H, 3 * H)
    assert torch.equal(tensors["d2t"], draft.d2t) and torch.equal(tensors["t2d"], draft.t2d)

    config = json.loads((out / CONFIG_FILE).read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert config["model_type"] == "llama"
    assert config["num_hidden_layers"] == 1
    assert (config["hidden_size"], config["intermediate_size"]) == (H, INTER)
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]) == (
        HEADS,
        KV_HEADS,
        HEAD_DIM,
    )
    assert config["vocab_size"] == VOCAB and config["draft_vocab_size"] == DRAFT_VOCAB
    assert config["target_hidden_size"] == H
    assert config["max_position_embeddings"] >= SERVING
    assert config["rope_theta"] == THETA and config["rope_scaling"] == LLAMA3_SCALING
    assert config["rope_parameters"] == {**LLAMA3_SCALING, "rope_theta": THETA}
    assert config["torch_dtype"] == "bfloat16"
    assert config["tie_word_embeddings"] is False
    assert config["eagle_config"] == {
        "eagle_aux_hidden_state_layer_ids": [1, 14, 26],
        "use_aux_hidden_state": True,
    }

    assert manifest["config_aux_layer_ids"] == {"ids": [1, 14, 26], "convention": "output_of_layer"}
    assert manifest["aux_layers"] == AUX.as_manifest()
    assert "target_rope_scaling_not_copied" not in manifest
    assert manifest["validation"]["logits_max_abs_diff"] <= 1e-5
    assert manifest["files"][WEIGHTS_FILE] == sha256_file(out / WEIGHTS_FILE)
    assert json.loads((out / MANIFEST_FILE).read_text()) == manifest


def test_vllm_export_files_and_config(draft, tmp_path):
    out = tmp_path / "vllm"
    manifest = do_export(VLLM, draft, out, dtype="float16")
    tensors = load_file(str(out / WEIGHTS_FILE))
    assert set(tensors) == set(KEY_MAPS[VLLM].values())
    assert "layers.0.self_attn.q_proj.weight" in tensors and "embed_tokens.weight" in tensors
    assert not any(k.startswith("midlayer.") for k in tensors)
    assert tensors["layers.0.self_attn.q_proj.weight"].shape == (HEADS * HEAD_DIM, 2 * H)
    assert tensors["embed_tokens.weight"].shape == (VOCAB, H)
    assert tensors["embed_tokens.weight"].dtype == torch.float16

    config = json.loads((out / CONFIG_FILE).read_text())
    assert config["speculators_model_type"] == "eagle3"
    assert config["architectures"] == ["Eagle3Speculator"]
    assert config["draft_vocab_size"] == DRAFT_VOCAB and config["target_hidden_size"] == H
    assert config["eagle_aux_hidden_state_layer_ids"] == [2, 15, 27]
    assert config["norm_before_residual"] is False
    assert config["speculators_version"]
    layer = config["transformer_layer_config"]
    assert layer["model_type"] == "llama" and layer["num_hidden_layers"] == 1
    assert layer["vocab_size"] == VOCAB and layer["max_position_embeddings"] >= SERVING
    assert layer["rope_scaling"] == LLAMA3_SCALING and layer["head_dim"] == HEAD_DIM
    assert layer["rope_theta"] == THETA and layer["rope_parameters"] == {
        **LLAMA3_SCALING,
        "rope_theta": THETA,
    }
    assert config["speculators_config"] == {
        "algorithm": "eagle3",
        "proposal_methods": [
            {
                "proposal_type": "greedy",
                "speculative_tokens": 3,
                "verifier_accept_k": 1,
                "accept_tolerance": 0.0,
            }
        ],
        "default_proposal_method": "greedy",
        "verifier": {"name_or_path": "org/target-model", "architectures": ["LlamaForCausalLM"]},
    }
    assert manifest["config_aux_layer_ids"] == {"ids": [2, 15, 27], "convention": "input_of_layer"}
    assert manifest["speculative_tokens"] == 3


def test_load_sglang_export_reproduces_the_trained_draft(draft, tmp_path):
    out = tmp_path / "sglang"
    do_export(SGLANG, draft, out)
    loaded = load_sglang_export(out, draft.embed_tokens.weight)
    assert isinstance(loaded, Eagle3Draft)
    assert torch.equal(loaded.d2t, draft.d2t) and torch.equal(loaded.t2d, draft.t2d)
    torch.testing.assert_close(one_step_logits(loaded), one_step_logits(draft), rtol=0, atol=0)
    bf16 = load_sglang_export(out, draft.embed_tokens.weight, compute_dtype="bfloat16")
    assert bf16.fc.weight.dtype == torch.bfloat16
    with pytest.raises(ExportError, match="embedding shape"):
        load_sglang_export(out, torch.zeros(VOCAB - 1, H))


def test_bfloat16_export_validates_against_the_rounded_draft(draft, tmp_path):
    out = tmp_path / "vllm"
    do_export(VLLM, draft, out, dtype="bfloat16")
    report = do_validate(VLLM, out, draft, dtype="bfloat16")
    assert report["logits_max_abs_diff"] <= 1e-5
    # the same files are not a float32 export
    with pytest.raises(ExportError, match="torch_dtype"):
        do_validate(VLLM, out, draft, dtype="float32")


# --- validation catches bad exports -----------------------------------------------------


def _rename_midlayer(t: dict) -> None:
    for key in [k for k in t if k.startswith("midlayer.")]:
        t["layers.0." + key.removeprefix("midlayer.")] = t.pop(key)


def _shrink_lm_head(t: dict) -> None:
    t["lm_head.weight"] = t["lm_head.weight"][:-1].clone()


def _perturb(key: str) -> Callable[[dict], None]:
    def change(t: dict) -> None:
        t[key] = t[key].clone()
        t[key].view(-1)[: t[key].numel() // 4] += 0.5

    return change


def _set(path: str, value) -> Callable[[dict], None]:
    *parents, last = path.split(".")

    def change(config: dict) -> None:
        node = config
        for p in parents:
            node = node[p]
        node[last] = value

    return change


SGLANG_BAD_WEIGHTS = {
    "renamed_to_speculators": (_rename_midlayer, r"lacks .*midlayer\.[\s\S]*does not know: .*layers\.0\."),
    "missing_key": (
        lambda t: t.pop("midlayer.mlp.up_proj.weight"),
        r"lacks \['midlayer\.mlp\.up_proj\.weight'\]",
    ),
    "wrong_shape": (_shrink_lm_head, r"lm_head\.weight is torch\.float32 \(49, 32\), expected .*\(50, 32\)"),
    "unknown_key": (
        lambda t: t.__setitem__("embed_tokens.weight", torch.zeros(VOCAB, H)),
        r"does not know: \['embed_tokens\.weight'\]",
    ),
    "wrong_dtype": (
        lambda t: t.__setitem__("fc.weight", t["fc.weight"].half()),
        r"fc\.weight is torch\.float16",
    ),
    "d2t_off_t2d": (lambda t: t["d2t"].__setitem__(0, t["d2t"][0] + 1), r"t2d does not mark"),
    "t2d_count": (lambda t: t["t2d"].__setitem__(1, True), r"t2d marks 51 target ids"),
    "perturbed_weight": (_perturb("midlayer.mlp.down_proj.weight"), r"other logits than the trained draft"),
    "perturbed_norm": (_perturb("midlayer.hidden_norm.weight"), r"other logits than the trained draft"),
}

SGLANG_BAD_CONFIG = {
    "context_below_serving": (
        _set("max_position_embeddings", 2048),
        r"max_position_embeddings is 2048, below",
    ),
    "input_of_ids": (
        _set("eagle_config.eagle_aux_hidden_state_layer_ids", [2, 15, 27]),
        r"\[2, 15, 27\] \(that is the .*input_of_layer numbering\); "
        r"sglang expects output_of_layer ids \[1, 14, 26\]",
    ),
    "ids_missing": (lambda c: c["eagle_config"].pop("eagle_aux_hidden_state_layer_ids"), r"is None"),
    "eagle_not_eagle3": (_set("architectures", ["LlamaForCausalLMEagle"]), r"architectures"),
    "tied_embeddings": (_set("tie_word_embeddings", True), r"tie_word_embeddings is True"),
    "draft_vocab": (_set("draft_vocab_size", 32000), r"draft_vocab_size is 32000, expected 50"),
    "rope_scaling_dropped": (_set("rope_scaling", None), r"config rope_scaling is None, expected \{"),
    "rope_scaling_other_factor": (
        _set("rope_scaling.factor", 4.0),
        r"config rope_scaling is \{.*'factor': 4\.0.*\}, expected \{.*'factor': 8\.0",
    ),
    "rope_parameters_plain": (
        _set("rope_parameters", {"rope_type": "default", "rope_theta": THETA}),
        r"config rope_parameters is \{'rope_type': 'default'",
    ),
    "rope_theta": (_set("rope_theta", 10000.0), r"config rope_theta is 10000\.0, expected 50000\.0"),
    "heads": (_set("num_key_value_heads", HEADS), r"num_key_value_heads is 4, expected 2"),
}


@pytest.fixture
def sglang_dir(draft, tmp_path) -> Path:
    out = tmp_path / "sglang"
    do_export(SGLANG, draft, out)
    return out


@pytest.fixture
def vllm_dir(draft, tmp_path) -> Path:
    out = tmp_path / "vllm"
    do_export(VLLM, draft, out)
    return out


@pytest.mark.parametrize("case", sorted(SGLANG_BAD_WEIGHTS))
def test_sglang_validation_catches_bad_weights(draft, sglang_dir, case):
    change, message = SGLANG_BAD_WEIGHTS[case]
    do_validate(SGLANG, sglang_dir, draft)  # valid before
    rewrite_weights(sglang_dir, change)
    with pytest.raises(ExportError, match=message):
        do_validate(SGLANG, sglang_dir, draft)


@pytest.mark.parametrize("case", sorted(SGLANG_BAD_CONFIG))
def test_sglang_validation_catches_bad_config(draft, sglang_dir, case):
    change, message = SGLANG_BAD_CONFIG[case]
    rewrite_config(sglang_dir, change)
    with pytest.raises(ExportError, match=message):
        do_validate(SGLANG, sglang_dir, draft)


VLLM_BAD_WEIGHTS = {
    "sglang_names": (
        lambda t: [
            t.__setitem__("midlayer." + k.removeprefix("layers.0."), t.pop(k))
            for k in list(t)
            if k.startswith("layers.0.")
        ],
        r"lacks .*layers\.0\.[\s\S]*does not know: .*midlayer\.",
    ),
    "missing_embed": (lambda t: t.pop("embed_tokens.weight"), r"lacks \['embed_tokens\.weight'\]"),
    "model_prefix": (
        lambda t: t.__setitem__("model.fc.weight", t.pop("fc.weight")),
        r"lacks \['fc\.weight'\][\s\S]*does not know: \['model\.fc\.weight'\]",
    ),
    "perturbed_embed_row": (
        lambda t: t["embed_tokens.weight"][VOCAB - 1].add_(1.0),
        r"embed_tokens\.weight differs from the target embedding",
    ),
    "perturbed_weight": (
        _perturb("layers.0.self_attn.o_proj.weight"),
        r"other logits than the trained draft",
    ),
}

VLLM_BAD_CONFIG = {
    "output_of_ids": (
        _set("eagle_aux_hidden_state_layer_ids", [1, 14, 26]),
        r"\(that is the output_of_layer numbering\); vllm expects input_of_layer ids \[2, 15, 27\]",
    ),
    "norm_before_residual_missing": (
        lambda c: c.pop("norm_before_residual"),
        r"norm_before_residual is None",
    ),
    "context_below_serving": (
        _set("transformer_layer_config.max_position_embeddings", 2048),
        r"transformer_layer_config\.max_position_embeddings is 2048, below the serving context 4096",
    ),
    "speculative_tokens": (
        _set("speculators_config.proposal_methods", [{"proposal_type": "greedy", "speculative_tokens": 5}]),
        r"speculative_tokens is 5, expected 3",
    ),
    "no_verifier": (
        _set("speculators_config.verifier", {"architectures": []}),
        r"verifier needs a name_or_path",
    ),
    "not_speculators": (_set("speculators_model_type", "eagle"), r"speculators_model_type"),
    "layer_count": (_set("transformer_layer_config.num_hidden_layers", 2), r"num_hidden_layers is 2"),
    "rope_scaling_dropped": (
        _set("transformer_layer_config.rope_scaling", None),
        r"config transformer_layer_config\.rope_scaling is None",
    ),
    "rope_parameters_other_type": (
        _set("transformer_layer_config.rope_parameters.rope_type", "linear"),
        r"config transformer_layer_config\.rope_parameters is \{.*'rope_type': 'linear'",
    ),
}


@pytest.mark.parametrize("case", sorted(VLLM_BAD_WEIGHTS))
def test_vllm_validation_catches_bad_weights(draft, vllm_dir, case):
    change, message = VLLM_BAD_WEIGHTS[case]
    do_validate(VLLM, vllm_dir, draft)
    rewrite_weights(vllm_dir, change)
    with pytest.raises(ExportError, match=message):
        do_validate(VLLM, vllm_dir, draft)


@pytest.mark.parametrize("case", sorted(VLLM_BAD_CONFIG))
def test_vllm_validation_catches_bad_config(draft, vllm_dir, case):
    change, message = VLLM_BAD_CONFIG[case]
    rewrite_config(vllm_dir, change)
    with pytest.raises(ExportError, match=message):
        do_validate(VLLM, vllm_dir, draft)


def test_validation_checks_against_the_given_draft(draft, sglang_dir):
    other = make_draft(seed=1)  # same shapes and vocab, other weights
    with pytest.raises(ExportError, match="other logits"):
        do_validate(SGLANG, sglang_dir, other)


def test_unreadable_files_are_reported(draft, sglang_dir):
    (sglang_dir / WEIGHTS_FILE).write_bytes(b"not a safetensors file")
    (sglang_dir / CONFIG_FILE).write_text("{")
    with pytest.raises(ExportError, match=r"config\.json unreadable[\s\S]*model\.safetensors unreadable"):
        do_validate(SGLANG, sglang_dir, draft)


# --- an export counts only once validated -------------------------------------------------


@pytest.mark.parametrize("fmt", [SGLANG, VLLM])
def test_failed_validation_leaves_no_final_dir(tmp_path, fmt):
    bad = make_draft()
    bad.t2d[1] = True  # t2d no longer matches d2t: the export must not count
    out = tmp_path / "draft"
    with pytest.raises(ExportError, match="t2d marks 51"):
        do_export(fmt, bad, out)
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []  # the temp dir is gone too


@pytest.mark.parametrize("fmt", [SGLANG, VLLM])
def test_failed_reexport_keeps_the_previous_export(draft, tmp_path, fmt):
    out = tmp_path / "draft"
    do_export(fmt, draft, out)
    before = {p.name: sha256_file(p) for p in out.iterdir()}
    bad = make_draft()
    bad.d2t[0] += 1
    with pytest.raises(ExportError):
        do_export(fmt, bad, out)
    assert {p.name: sha256_file(p) for p in out.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["draft"]
    do_export(fmt, draft, out, dtype="bfloat16")  # a good re-export replaces it
    assert json.loads((out / CONFIG_FILE).read_text())["torch_dtype"] == "bfloat16"
    assert [p.name for p in tmp_path.iterdir()] == ["draft"]


def test_export_refuses_mismatched_inputs(draft, tmp_path):
    out = tmp_path / "draft"
    with pytest.raises(ExportError, match="num_hidden_layers is 30 but the aux layers say 32"):
        do_export(SGLANG, draft, out, aux=AuxLayers.default(32))
    with pytest.raises(ExportError, match="start at 2"):
        do_export(SGLANG, draft, out, aux=AuxLayers.from_output_of([2, 14, 26], LAYERS))
    with pytest.raises(ExportError, match="dtype 'int8'"):
        do_export(VLLM, draft, out, dtype="int8")
    with pytest.raises(ExportError, match="speculative_tokens"):
        export_vllm(
            draft,
            out,
            aux=AUX,
            target_config=TARGET_CONFIG,
            verifier_name_or_path="org/target-model",
            speculative_tokens=0,
            serving_context=SERVING,
            dtype="float32",
        )
    assert not out.exists()


def test_ambiguous_sglang_ids_export_when_allowed(draft, tmp_path):
    shifted = AuxLayers.from_output_of([2, 14, 26], LAYERS)
    out = tmp_path / "sglang"
    export_sglang(
        draft,
        out,
        aux=shifted,
        target_config=TARGET_CONFIG,
        serving_context=SERVING,
        dtype="float32",
        allow_ambiguous_sglang_ids=True,
    )
    config = json.loads((out / CONFIG_FILE).read_text())
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 14, 26]


# --- the demo target's real config --------------------------------------------------------


def test_export_from_the_demo_target_config(demo_model_dir, tmp_path):
    from transformers import AutoConfig, LlamaConfig

    target_config = json.loads((demo_model_dir / "config.json").read_text())
    text = AutoConfig.from_pretrained(demo_model_dir)
    with safe_open(str(demo_model_dir / "model.safetensors"), "pt") as f:
        embed = f.get_tensor("model.embed_tokens.weight")
    cfg = DraftConfig.from_target(text, draft_vocab_size=512, max_position_embeddings=2048)
    torch.manual_seed(0)
    demo = Eagle3Draft(cfg, embed)
    counts = Counter({t: 1 + t % 17 for t in range(0, cfg.vocab_size, 11)})
    mapping = vocab.build(counts, cfg.draft_vocab_size, cfg.vocab_size)
    demo.set_vocab(mapping["d2t"], mapping["t2d"])
    aux = AuxLayers.default(text.num_hidden_layers)

    sglang = tmp_path / "sglang"
    export_sglang(demo, sglang, aux=aux, target_config=target_config, serving_context=8192, dtype="bfloat16")
    loaded = AutoConfig.from_pretrained(sglang)  # what SGLang's config loader sees
    assert isinstance(loaded, LlamaConfig)
    assert loaded.architectures == ["LlamaForCausalLMEagle3"]
    assert (loaded.hidden_size, loaded.vocab_size, loaded.draft_vocab_size) == (576, 49152, 512)
    assert loaded.head_dim == 64 and loaded.num_key_value_heads == 3
    assert loaded.max_position_embeddings >= 8192
    assert loaded.rope_parameters == {"rope_type": "default", "rope_theta": 100000.0}
    assert loaded.eagle_config["eagle_aux_hidden_state_layer_ids"] == [1, 14, 26]
    assert loaded.tie_word_embeddings is False

    vllm = tmp_path / "vllm"
    export_vllm(
        demo,
        vllm,
        aux=aux,
        target_config=target_config,
        verifier_name_or_path=str(demo_model_dir),
        speculative_tokens=4,
        serving_context=8192,
        dtype="bfloat16",
    )
    config = json.loads((vllm / CONFIG_FILE).read_text())
    layer = LlamaConfig(**config["transformer_layer_config"])
    assert (layer.hidden_size, layer.num_hidden_layers, layer.vocab_size) == (576, 1, 49152)
    assert config["eagle_aux_hidden_state_layer_ids"] == [2, 15, 27]
    assert config["speculators_config"]["verifier"]["architectures"] == ["LlamaForCausalLM"]
    stored = load_file(str(vllm / WEIGHTS_FILE))["embed_tokens.weight"]
    assert torch.equal(stored, embed.to(torch.bfloat16))
    reloaded = load_sglang_export(sglang, embed, compute_dtype="float32")
    assert reloaded.config.hidden_size == 576 and reloaded.lm_head.weight.shape == (512, 576)


# --- RoPE: the target's, in the form each consumer reads -------------------------------------


@pytest.mark.parametrize("fmt", [SGLANG, VLLM])
@pytest.mark.parametrize(
    "case",
    ["plain_draft", "other_factor", "other_theta", "dynamic_target"],
)
def test_export_refuses_a_draft_whose_rope_is_not_the_targets(tmp_path, fmt, case):
    draft, target, message = {
        "plain_draft": (
            make_draft(rope_scaling=None),
            TARGET_CONFIG,
            r"the draft's RoPE is not the target's: target config rope_scaling\.factor is 8\.0 but the "
            r"draft's is None;[\s\S]*rope_scaling\.rope_type is 'llama3' but the draft's is None",
        ),
        "other_factor": (
            make_draft(rope_scaling={**LLAMA3_SCALING, "factor": 4.0}),
            TARGET_CONFIG,
            r"target config rope_scaling\.factor is 8\.0 but the draft's is 4\.0\. ",
        ),
        "other_theta": (
            make_draft(rope_theta=10000.0),
            TARGET_CONFIG,
            r"target config rope_theta is 50000\.0 but the draft's is 10000\.0\. ",
        ),
        "dynamic_target": (
            make_draft(),
            {**TARGET_CONFIG, "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}},
            r"target config: rope_type 'dynamic' is refused",
        ),
    }[case]
    out = tmp_path / "draft"
    with pytest.raises(ExportError, match=message):
        do_export(fmt, draft, out, target_config=target)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("fmt", [SGLANG, VLLM])
def test_a_plain_target_exports_plain_rope_as_before(tmp_path, fmt):
    """A target without scaling (either config form) gives the fields exports had before."""
    draft = make_draft(rope_scaling=None)
    older = {**TARGET_CONFIG, "rope_scaling": None}
    newer = {**older, "rope_parameters": {"rope_type": "default", "rope_theta": THETA}}
    del newer["rope_scaling"], newer["rope_theta"]
    for name, target in (("older", older), ("newer", newer)):
        manifest = do_export(fmt, draft, tmp_path / name, target_config=target)
        config = json.loads((tmp_path / name / CONFIG_FILE).read_text())
        layer = config.get("transformer_layer_config", config)
        assert layer["rope_scaling"] is None and layer["rope_theta"] == THETA
        assert layer["rope_parameters"] == {"rope_type": "default", "rope_theta": THETA}
        assert set(manifest) >= {"format", "aux_layers", "validation"}
        assert not any("rope" in key for key in manifest)


def test_consumers_build_the_targets_rope_from_the_export(tmp_path):
    """A yarn target in transformers 5's form: what SGLang's config loader and vLLM's layer
    config see gives the trained draft's cos/sin, far beyond the original context."""
    from transformers import AutoConfig, LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    from draftsmith.draft.rope import rope_settings, rotary

    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256, "beta_fast": 16}
    target = {k: v for k, v in TARGET_CONFIG.items() if k not in ("rope_scaling", "rope_theta")}
    target["rope_parameters"] = {**yarn, "rope_theta": THETA}
    draft = make_draft(rope_scaling=rope_settings(target)[1])
    assert draft.config.rope_scaling == yarn
    do_export(SGLANG, draft, tmp_path / "sglang", target_config=target)
    do_export(VLLM, draft, tmp_path / "vllm", target_config=target)

    positions = torch.tensor([[0, 5, 255, 256, 1023, 4000, 100000]])
    want = rotary(positions, HEAD_DIM, THETA, yarn)
    sglang = AutoConfig.from_pretrained(tmp_path / "sglang")
    assert sglang.rope_parameters == {**yarn, "rope_theta": THETA}
    layer = json.loads((tmp_path / "vllm" / CONFIG_FILE).read_text())["transformer_layer_config"]
    for consumer in (sglang, LlamaConfig(**layer)):
        got = LlamaRotaryEmbedding(consumer)(torch.zeros(1), positions)
        torch.testing.assert_close(got, want)
    reloaded = load_sglang_export(tmp_path / "sglang", draft.embed_tokens.weight)
    assert reloaded.config.rope_scaling == yarn and reloaded.config.rope_theta == THETA
