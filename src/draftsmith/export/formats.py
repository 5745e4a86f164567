"""Export a trained EAGLE-3 draft for SGLang and for vLLM (speculators format), validated.

Two formats, one set of weights:

- SGLang (also EAGLE official, ModelOpt): `LlamaForCausalLMEagle3`, the decoder layer
  as `midlayer.*`, no `embed_tokens` (SGLang shares the target's embedding).
- vLLM speculators: `Eagle3Speculator`, the decoder layer as `layers.0.*`, with
  `embed_tokens`; keys carry no `model.` prefix (vLLM's `Eagle3LlamaForCausalLM.
  load_weights` adds it, and speculators' `Eagle3DraftModel` names its modules so).

`KEY_MAPS` is the only place that knows the file key names and `aux_layer_ids` the only
place that knows which aux-layer numbering each consumer reads. An export counts as
done only after validation: the draft's RoPE must be the target's, and the files are
written into a temp directory beside the target, reloaded and checked (keys, shapes,
dtypes, config fields, layer ids, vocab mapping, and logits of a draft rebuilt from the
files against the trained draft), and renamed into place only then. SGLang silently
skips unknown keys and never reports missing ones (the draft then runs with random
weights and acceptance ~1.0), so nothing here may rely on the consumer to notice a bad
file.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from draftsmith.draft.model import DraftConfig, Eagle3Draft
from draftsmith.draft.rope import RopeError, rope_settings
from draftsmith.errors import DraftsmithError
from draftsmith.store.atomic import atomic_dir
from draftsmith.store.hashing import sha256_file
from draftsmith.store.plan import EXPORT_FILES
from draftsmith.target.dtypes import DTYPES
from draftsmith.target.layers import INPUT_OF, OUTPUT_OF, AuxLayers, sglang_layer_ids

SGLANG = "sglang"
VLLM = "vllm"
FORMATS = (SGLANG, VLLM)

CONFIG_FILE = EXPORT_FILES["config"]
WEIGHTS_FILE = EXPORT_FILES["weights"]
MANIFEST_FILE = EXPORT_FILES["record"]

SGLANG_ARCHITECTURE = "LlamaForCausalLMEagle3"
VLLM_ARCHITECTURE = "Eagle3Speculator"
# Informational: vLLM does not read it. 0.3.0 is a released speculators version (its
# announcement shows an eagle3 config.json of this shape); not checked against its schema.
SPECULATORS_VERSION = "0.3.0"


# The logits check compares float32 computations on identical (dtype-rounded) weights,
# so any difference beyond float noise means the files do not hold the trained draft.
LOGITS_ATOL = 1e-5
LOGITS_RTOL = 1e-5
_SAMPLE_TOKENS = 8
_SAMPLE_STEPS = 2
_SAMPLE_SEED = 1234

# ---------------------------------------------------------------------------------
# Key names: draft parameter name (SGLang's, see model.py) -> key in each format's file.
# SGLang: identity, no embed_tokens (python/sglang/srt/models/llama_eagle3.py loads
# `midlayer.*`, `fc`, `norm`, `lm_head`, reads `d2t`, skips `t2d`, ignores the rest).
# vLLM speculators: `midlayer.` -> `layers.0.`, plus embed_tokens (speculators
# src/speculators/models/eagle3/core.py: Eagle3DraftModel.{embed_tokens, fc, layers,
# norm, lm_head, d2t, t2d}; first layer norms hidden_norm / input_layernorm /
# post_attention_layernorm in eagle3/model_definitions.py; vLLM
# vllm/model_executor/models/llama_eagle3.py adds the `model.` prefix itself and
# raises on keys it does not know).
# ---------------------------------------------------------------------------------
_LAYER_PARAMS = (
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
    "hidden_norm.weight",
    "input_layernorm.weight",
    "post_attention_layernorm.weight",
)
_SHARED_KEYS = ("fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d")
EMBED_KEY = "embed_tokens.weight"

KEY_MAPS: dict[str, dict[str, str]] = {
    SGLANG: {
        **{f"midlayer.{p}": f"midlayer.{p}" for p in _LAYER_PARAMS},
        **{k: k for k in _SHARED_KEYS},
    },
    VLLM: {
        **{f"midlayer.{p}": f"layers.0.{p}" for p in _LAYER_PARAMS},
        **{k: k for k in _SHARED_KEYS},
        EMBED_KEY: EMBED_KEY,
    },
}

# ---------------------------------------------------------------------------------
# Aux layer ids in each consumer's draft config (`eagle_aux_hidden_state_layer_ids`).
# - SGLang reads `eagle_config.eagle_aux_hidden_state_layer_ids` (model_runner.py) and
#   passes it to the target's `set_eagle3_layers_to_capture`, which adds 1
#   (python/sglang/srt/models/llama.py: "for the ith layer, it takes the output of the
#   (i-1)th layer"), so the key holds OUTPUT-OF ids: default [1, N//2-1, N-4].
#   Newer SGLang (PR #25454, models/deepseek_v2.py, the Kimi/DeepSeek path) adds 1 only
#   when the first id is 1 and otherwise reads the ids as input-of, so output-of ids
#   whose first id is not 1 mean different layers in different SGLang versions.
# - vLLM reads top-level `eagle_aux_hidden_state_layer_ids` (speculators algos.py
#   copies it; gpu_model_runner._get_eagle3_aux_layers_from_config and
#   v1/worker/gpu/spec_decode/eagle/eagle3_utils.py pass it on unchanged) and captures
#   the residual stream ENTERING layer idx (models/llama.py: `if idx in
#   self.aux_hidden_state_layers: aux_hidden_states.append(hidden_states + residual)`),
#   so the key holds INPUT-OF ids: default [2, N//2, N-3]. Recent vLLM can be told
#   `eagle_aux_layer_semantics: "sglang"`; absent, it is "vllm" (input-of), which is
#   what is written here.
# REFERENCE.md's "input of layer [2, N//2, N-3] (SGLang, vLLM)" is right for SGLang's
# internal `layers_to_capture`, not for the id list an SGLang draft config carries.
# ---------------------------------------------------------------------------------
AUX_LAYER_CONVENTION = {SGLANG: OUTPUT_OF, VLLM: INPUT_OF}


class ExportError(DraftsmithError):
    """An export that would not load, or would load as something other than the trained draft."""


def aux_layer_ids(fmt: str, aux: AuxLayers, *, allow_ambiguous_sglang_ids: bool = False) -> list[int]:
    """The `eagle_aux_hidden_state_layer_ids` a `fmt` draft config must carry for `aux`."""
    if fmt == SGLANG:
        ids = sglang_layer_ids(aux)  # output-of (layers.py documents SGLang's +1)
        if ids[0] != 1 and not allow_ambiguous_sglang_ids:
            raise ExportError(
                f"aux layers (output_of_layer) {ids} start at {ids[0]}, not 1: SGLang versions "
                "disagree on such ids (llama.py always adds 1; deepseek_v2.py since PR #25454 "
                "adds 1 only when the first id is 1), so the served draft could get other layers "
                "than it was trained on. Train with aux layers starting at output-of layer 1 (the "
                "EAGLE-3 default), or pass allow_ambiguous_sglang_ids=True for a pinned SGLang "
                "whose target model adds 1 unconditionally."
            )
        return ids
    if fmt == VLLM:
        return list(aux.input_of)
    raise ExportError(f"unknown export format {fmt!r}; expected one of {list(FORMATS)}")


# ---------------------------------------------------------------------------------
# Export
# ---------------------------------------------------------------------------------


def export_sglang(
    draft: Eagle3Draft,
    out_dir: Path,
    *,
    aux: AuxLayers,
    target_config: dict,
    serving_context: int,
    dtype: str,
    allow_ambiguous_sglang_ids: bool = False,
) -> dict:
    """Write and validate an SGLang draft directory; returns its manifest."""
    _check_export_args(draft, aux, target_config, serving_context, dtype)
    ids = aux_layer_ids(SGLANG, aux, allow_ambiguous_sglang_ids=allow_ambiguous_sglang_ids)
    text = _text_config(target_config)
    config = {
        "architectures": [SGLANG_ARCHITECTURE],
        "model_type": "llama",
        "num_hidden_layers": 1,
        **_layer_fields(draft.config, _max_positions(draft.config, text, serving_context)),
        "draft_vocab_size": draft.config.draft_vocab_size,
        "target_hidden_size": _target_hidden(draft.config),
        "torch_dtype": dtype,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": ids, "use_aux_hidden_state": True},
    }

    def validate(path: Path) -> dict:
        return validate_sglang(
            path,
            draft,
            aux=aux,
            serving_context=serving_context,
            dtype=dtype,
            allow_ambiguous_sglang_ids=allow_ambiguous_sglang_ids,
        )

    return _write_validated(
        Path(out_dir),
        config,
        _export_tensors(draft, SGLANG, dtype),
        validate,
        _manifest_base(SGLANG, aux, ids, dtype, serving_context),
    )


def export_vllm(
    draft: Eagle3Draft,
    out_dir: Path,
    *,
    aux: AuxLayers,
    target_config: dict,
    verifier_name_or_path: str,
    speculative_tokens: int,
    serving_context: int,
    dtype: str,
) -> dict:
    """Write and validate a vLLM speculators draft directory; returns its manifest."""
    _check_export_args(draft, aux, target_config, serving_context, dtype)
    if (
        isinstance(speculative_tokens, bool)
        or not isinstance(speculative_tokens, int)
        or speculative_tokens < 1
    ):
        raise ExportError(f"speculative_tokens must be a positive integer, got {speculative_tokens!r}")
    if not isinstance(verifier_name_or_path, str) or not verifier_name_or_path:
        raise ExportError(f"verifier_name_or_path must be a non-empty string, got {verifier_name_or_path!r}")
    ids = aux_layer_ids(VLLM, aux)
    text = _text_config(target_config)
    layer_config = {
        "model_type": "llama",
        "num_hidden_layers": 1,
        **_layer_fields(draft.config, _max_positions(draft.config, text, serving_context)),
        "torch_dtype": dtype,
    }
    config = {
        "speculators_model_type": "eagle3",
        "speculators_version": SPECULATORS_VERSION,
        "architectures": [VLLM_ARCHITECTURE],
        "transformer_layer_config": layer_config,
        "draft_vocab_size": draft.config.draft_vocab_size,
        "target_hidden_size": _target_hidden(draft.config),
        "eagle_aux_hidden_state_layer_ids": ids,
        # The draft adds the raw hidden state as residual (model.py step()). vLLM's
        # speculators loader defaults a missing norm_before_residual to True
        # (vllm/transformers_utils/configs/speculators/algos.py), so it must be explicit.
        "norm_before_residual": False,
        "torch_dtype": dtype,
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [
                {
                    "proposal_type": "greedy",
                    "speculative_tokens": speculative_tokens,
                    "verifier_accept_k": 1,
                    "accept_tolerance": 0.0,
                }
            ],
            "default_proposal_method": "greedy",
            "verifier": {
                "name_or_path": verifier_name_or_path,
                "architectures": list(target_config.get("architectures") or []),
            },
        },
    }

    def validate(path: Path) -> dict:
        return validate_vllm(
            path,
            draft,
            aux=aux,
            serving_context=serving_context,
            dtype=dtype,
            speculative_tokens=speculative_tokens,
        )

    manifest = _manifest_base(VLLM, aux, ids, dtype, serving_context)
    manifest["speculative_tokens"] = speculative_tokens
    manifest["verifier_name_or_path"] = verifier_name_or_path
    return _write_validated(Path(out_dir), config, _export_tensors(draft, VLLM, dtype), validate, manifest)


def _check_export_args(
    draft: Eagle3Draft, aux: AuxLayers, target_config: dict, serving_context: int, dtype: str
) -> None:
    if dtype not in DTYPES:
        raise ExportError(f"export dtype {dtype!r} is not one of {sorted(DTYPES)}")
    if isinstance(serving_context, bool) or not isinstance(serving_context, int) or serving_context < 1:
        raise ExportError(f"serving_context must be a positive integer, got {serving_context!r}")
    if not isinstance(aux, AuxLayers):
        raise ExportError(f"aux must be an AuxLayers, got {type(aux).__name__}")
    text = _text_config(target_config)
    c = draft.config
    checks = {
        "num_hidden_layers": (text.get("num_hidden_layers"), aux.num_layers, "aux layers"),
        "vocab_size": (text.get("vocab_size"), c.vocab_size, "draft vocab_size"),
        "hidden_size": (text.get("hidden_size"), _target_hidden(c), "draft target_hidden_size"),
    }
    for field, (target_value, ours, what) in checks.items():
        if target_value != ours:
            raise ExportError(f"target config {field} is {target_value!r} but the {what} say {ours!r}")
    _check_target_rope(c, text)


def _check_target_rope(c: DraftConfig, text: dict) -> None:
    """SGLang and vLLM serve the draft with the RoPE its config names, which must be the one
    it was trained with and, for long contexts, the target's: the draft's must equal the target's."""
    try:
        theta, scaling = rope_settings(text)
    except RopeError as exc:
        raise ExportError(f"target config: {exc}") from None
    target, draft = _rope_fields(theta, scaling), _rope_fields(c.rope_theta, c.rope_scaling)
    found = [
        f"{field} is {target.get(field)!r} but the draft's is {draft.get(field)!r}"
        for field in sorted(target.keys() | draft.keys())
        if target.get(field) != draft.get(field)
    ]
    if found:
        raise ExportError(
            "the draft's RoPE is not the target's: target config " + "; ".join(found) + ". Served with "
            "either, the draft would see other positions than in training or than the target does "
            "beyond the original context; retrain the draft for this target (DraftConfig.from_target "
            "copies its RoPE)"
        )


def _text_config(target_config: dict) -> dict:
    """The language-model part of a target config.json (multimodal targets nest it)."""
    if not isinstance(target_config, dict):
        raise ExportError(
            f"target_config must be a dict (the target's config.json), got {type(target_config)}"
        )
    text = target_config.get("text_config")
    return text if isinstance(text, dict) else target_config


def _target_hidden(c: DraftConfig) -> int:
    return c.target_hidden_size or c.hidden_size


def _max_positions(c: DraftConfig, text: dict, serving_context: int) -> int:
    # Below the served context a draft loses acceptance (2048 gave near-zero in a public
    # report); above it costs the server only a longer RoPE cache, as model.py has none.
    return max(c.max_position_embeddings, serving_context, int(text.get("max_position_embeddings") or 0))


def _rope_fields(theta: float, scaling: dict | None) -> dict:
    """RoPE settings as flat fields (rope_scaling.factor, ...), to name the one that differs."""
    return {"rope_theta": theta, **{f"rope_scaling.{key}": value for key, value in (scaling or {}).items()}}


def _rope_parameters(c: DraftConfig) -> dict:
    return {**(c.rope_scaling or {"rope_type": "default"}), "rope_theta": c.rope_theta}


def _layer_fields(c: DraftConfig, max_position_embeddings: int) -> dict:
    """Llama fields of the single draft layer. RoPE is the draft's (the target's, checked):
    `rope_theta` + `rope_scaling` as SGLang's Llama layer and older readers take it,
    `rope_parameters` as transformers 5 does."""
    return {
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads,
        "head_dim": c.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": c.rms_norm_eps,
        "rope_theta": c.rope_theta,
        "rope_scaling": c.rope_scaling,
        "rope_parameters": _rope_parameters(c),
        "vocab_size": c.vocab_size,
        "max_position_embeddings": max_position_embeddings,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
    }


def _manifest_base(fmt: str, aux: AuxLayers, ids: list[int], dtype: str, serving_context: int) -> dict:
    return {
        "format": fmt,
        "dtype": dtype,
        "serving_context": serving_context,
        "aux_layers": aux.as_manifest(),
        "config_aux_layer_ids": {"ids": ids, "convention": AUX_LAYER_CONVENTION[fmt]},
    }


def _export_tensors(draft: Eagle3Draft, fmt: str, dtype: str) -> dict[str, torch.Tensor]:
    state = {name: t.detach().to("cpu") for name, t in draft.state_dict().items()}
    known = set(KEY_MAPS[VLLM])  # every draft tensor, embedding included
    if set(state) != known:
        raise ExportError(
            "the draft's tensor names no longer match export.KEY_MAPS: "
            f"unmapped {sorted(set(state) - known)}, absent {sorted(known - set(state))}"
        )
    return {key: _cast(name, state[name], dtype).contiguous() for name, key in KEY_MAPS[fmt].items()}


def _cast(name: str, tensor: torch.Tensor, dtype: str) -> torch.Tensor:
    if name == "d2t":
        return tensor.to(torch.int64)
    if name == "t2d":
        return tensor.to(torch.bool)
    return tensor.to(DTYPES[dtype])


def _write_validated(
    out_dir: Path,
    config: dict,
    tensors: dict[str, torch.Tensor],
    validate: Callable[[Path], dict],
    manifest: dict,
) -> dict:
    """Write into a temp dir beside `out_dir`, validate, then rename into place."""
    with atomic_dir(out_dir) as tmp:
        (tmp / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        save_file(tensors, str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
        manifest = {
            **manifest,
            "validation": validate(tmp),
            "files": {name: sha256_file(tmp / name) for name in (CONFIG_FILE, WEIGHTS_FILE)},
        }
        (tmp / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest


# ---------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------


def validate_sglang(
    out_dir: Path,
    draft: Eagle3Draft,
    *,
    aux: AuxLayers,
    serving_context: int,
    dtype: str,
    allow_ambiguous_sglang_ids: bool = False,
) -> dict:
    """Check an SGLang export against the trained draft; raises ExportError listing every fault."""
    out_dir = Path(out_dir)
    problems: list[str] = []
    config, tensors = _read_export(out_dir, problems)
    cfg = None
    if config is not None:
        _expect(problems, "architectures", config.get("architectures"), [SGLANG_ARCHITECTURE])
        _expect(problems, "model_type", config.get("model_type"), "llama")
        eagle = config.get("eagle_config")
        if not isinstance(eagle, dict):
            problems.append(f"config eagle_config must be a mapping, got {eagle!r}")
        else:
            _expect(problems, "eagle_config.use_aux_hidden_state", eagle.get("use_aux_hidden_state"), True)
            _expect_ids(
                problems,
                "eagle_config.eagle_aux_hidden_state_layer_ids",
                eagle.get("eagle_aux_hidden_state_layer_ids"),
                SGLANG,
                aux,
                allow_ambiguous_sglang_ids,
            )
        cfg = _check_layer_config(problems, "", config, draft, serving_context, dtype)
        _check_top_fields(problems, config, draft)
    return _finish(SGLANG, out_dir, problems, cfg, tensors, draft, dtype)


def validate_vllm(
    out_dir: Path,
    draft: Eagle3Draft,
    *,
    aux: AuxLayers,
    serving_context: int,
    dtype: str,
    speculative_tokens: int | None = None,
) -> dict:
    """Check a vLLM speculators export against the trained draft; raises ExportError listing every fault."""
    out_dir = Path(out_dir)
    problems: list[str] = []
    config, tensors = _read_export(out_dir, problems)
    cfg = None
    if config is not None:
        _expect(problems, "speculators_model_type", config.get("speculators_model_type"), "eagle3")
        _expect(problems, "architectures", config.get("architectures"), [VLLM_ARCHITECTURE])
        _expect(problems, "norm_before_residual", config.get("norm_before_residual"), False)
        _expect(problems, "torch_dtype", config.get("torch_dtype"), dtype)
        _expect_ids(
            problems,
            "eagle_aux_hidden_state_layer_ids",
            config.get("eagle_aux_hidden_state_layer_ids"),
            VLLM,
            aux,
            False,
        )
        _check_top_fields(problems, config, draft)
        _check_speculators_config(problems, config.get("speculators_config"), speculative_tokens)
        layer = config.get("transformer_layer_config")
        if not isinstance(layer, dict):
            problems.append(f"config transformer_layer_config must be a mapping, got {layer!r}")
        else:
            _expect(problems, "transformer_layer_config.model_type", layer.get("model_type"), "llama")
            merged = {
                **layer,
                "draft_vocab_size": config.get("draft_vocab_size"),
                "target_hidden_size": config.get("target_hidden_size"),
            }
            cfg = _check_layer_config(
                problems, "transformer_layer_config.", merged, draft, serving_context, dtype
            )
    return _finish(VLLM, out_dir, problems, cfg, tensors, draft, dtype)


def _read_export(out_dir: Path, problems: list[str]) -> tuple[dict | None, dict[str, torch.Tensor] | None]:
    config = tensors = None
    try:
        config = json.loads((out_dir / CONFIG_FILE).read_text(encoding="utf-8"))
        if not isinstance(config, dict):
            problems.append(f"{CONFIG_FILE} is not a JSON object")
            config = None
    except (OSError, json.JSONDecodeError) as exc:
        problems.append(f"{CONFIG_FILE} unreadable: {exc}")
    try:
        tensors = load_file(str(out_dir / WEIGHTS_FILE))
    except (OSError, SafetensorError) as exc:
        problems.append(f"{WEIGHTS_FILE} unreadable: {exc}")
    return config, tensors


def _expect(problems: list[str], field: str, got: Any, want: Any) -> None:
    if got != want or type(got) is not type(want):
        problems.append(f"config {field} is {got!r}, expected {want!r}")


def _expect_ids(problems: list[str], field: str, got: Any, fmt: str, aux: AuxLayers, allow: bool) -> None:
    try:
        want = aux_layer_ids(fmt, aux, allow_ambiguous_sglang_ids=allow)
    except ExportError as exc:
        problems.append(str(exc))
        return
    if got != want:
        others = {
            conv: ids for conv, ids in aux.as_manifest().items() if ids == got and conv != "num_hidden_layers"
        }
        hint = f" (that is the {', '.join(others)} numbering)" if others else ""
        problems.append(
            f"config {field} is {got!r}{hint}; {fmt} expects {AUX_LAYER_CONVENTION[fmt]} ids {want!r} "
            f"for aux layers {aux.as_manifest()}"
        )


def _check_top_fields(problems: list[str], config: dict, draft: Eagle3Draft) -> None:
    _expect(problems, "draft_vocab_size", config.get("draft_vocab_size"), draft.config.draft_vocab_size)
    _expect(problems, "target_hidden_size", config.get("target_hidden_size"), _target_hidden(draft.config))


def _check_layer_config(
    problems: list[str], where: str, config: dict, draft: Eagle3Draft, serving_context: int, dtype: str
) -> DraftConfig | None:
    """Compare the layer fields with the trained draft; return the DraftConfig a consumer would build."""
    c = draft.config
    _expect(problems, f"{where}num_hidden_layers", config.get("num_hidden_layers"), 1)
    _expect(problems, f"{where}tie_word_embeddings", config.get("tie_word_embeddings"), False)
    _expect(problems, f"{where}hidden_act", config.get("hidden_act"), "silu")
    _expect(problems, f"{where}rope_scaling", config.get("rope_scaling"), c.rope_scaling)
    _expect(problems, f"{where}torch_dtype", config.get("torch_dtype"), dtype)
    rope = config.get("rope_parameters")
    if rope is not None and rope != _rope_parameters(c):
        problems.append(f"config {where}rope_parameters is {rope!r}, expected {_rope_parameters(c)!r}")
    for field in (
        "hidden_size",
        "intermediate_size",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "vocab_size",
    ):
        _expect(problems, f"{where}{field}", config.get(field), getattr(c, field))
    for field in ("rms_norm_eps", "rope_theta"):
        got = config.get(field)
        if (
            not isinstance(got, int | float)
            or isinstance(got, bool)
            or not math.isclose(got, getattr(c, field))
        ):
            problems.append(f"config {where}{field} is {got!r}, expected {getattr(c, field)!r}")
    positions = config.get("max_position_embeddings")
    if isinstance(positions, bool) or not isinstance(positions, int) or positions < serving_context:
        problems.append(
            f"config {where}max_position_embeddings is {positions!r}, below the serving context "
            f"{serving_context} (a draft limited below the served context loses acceptance)"
        )
    try:
        return _config_from_fields(config)
    except (KeyError, TypeError, ValueError) as exc:
        problems.append(f"config {where}cannot describe a draft: {type(exc).__name__}: {exc}")
        return None


def _check_speculators_config(problems: list[str], spec: Any, speculative_tokens: int | None) -> None:
    if not isinstance(spec, dict):
        problems.append(f"config speculators_config must be a mapping, got {spec!r}")
        return
    _expect(problems, "speculators_config.algorithm", spec.get("algorithm"), "eagle3")
    _expect(
        problems, "speculators_config.default_proposal_method", spec.get("default_proposal_method"), "greedy"
    )
    methods = spec.get("proposal_methods")
    if not isinstance(methods, list) or not methods or not isinstance(methods[0], dict):
        problems.append(
            f"config speculators_config.proposal_methods must be a non-empty list, got {methods!r}"
        )
    else:
        first = methods[0]
        _expect(
            problems,
            "speculators_config.proposal_methods[0].proposal_type",
            first.get("proposal_type"),
            "greedy",
        )
        tokens = first.get("speculative_tokens")
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
            problems.append(f"config speculators_config.proposal_methods[0].speculative_tokens is {tokens!r}")
        elif speculative_tokens is not None and tokens != speculative_tokens:
            problems.append(
                f"config speculators_config.proposal_methods[0].speculative_tokens is {tokens}, "
                f"expected {speculative_tokens}"
            )
    verifier = spec.get("verifier")
    if (
        not isinstance(verifier, dict)
        or not isinstance(verifier.get("name_or_path"), str)
        or not verifier["name_or_path"]
    ):
        problems.append(f"config speculators_config.verifier needs a name_or_path, got {verifier!r}")


def expected_tensors(
    cfg: DraftConfig, fmt: str, dtype: str
) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """File key -> (shape, dtype) that a `fmt` consumer builds from `cfg`."""
    h, hd = cfg.hidden_size, cfg.head_dim
    q, kv = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
    i = cfg.intermediate_size
    shapes = {
        "midlayer.self_attn.q_proj.weight": (q, 2 * h),
        "midlayer.self_attn.k_proj.weight": (kv, 2 * h),
        "midlayer.self_attn.v_proj.weight": (kv, 2 * h),
        "midlayer.self_attn.o_proj.weight": (h, q),
        "midlayer.mlp.gate_proj.weight": (i, h),
        "midlayer.mlp.up_proj.weight": (i, h),
        "midlayer.mlp.down_proj.weight": (h, i),
        "midlayer.hidden_norm.weight": (h,),
        "midlayer.input_layernorm.weight": (h,),
        "midlayer.post_attention_layernorm.weight": (h,),
        "fc.weight": (h, 3 * _target_hidden(cfg)),
        "norm.weight": (h,),
        "lm_head.weight": (cfg.draft_vocab_size, h),
        "d2t": (cfg.draft_vocab_size,),
        "t2d": (cfg.vocab_size,),
        EMBED_KEY: (cfg.vocab_size, h),
    }
    dtypes = {"d2t": torch.int64, "t2d": torch.bool}
    return {key: (shapes[name], dtypes.get(name, DTYPES[dtype])) for name, key in KEY_MAPS[fmt].items()}


def _check_tensors(
    problems: list[str], tensors: dict[str, torch.Tensor], cfg: DraftConfig, fmt: str, dtype: str
) -> None:
    expected = expected_tensors(cfg, fmt, dtype)
    missing = sorted(set(expected) - set(tensors))
    unknown = sorted(set(tensors) - set(expected))
    if missing:
        problems.append(f"{WEIGHTS_FILE} lacks {missing} ({fmt} would keep random weights for them)")
    if unknown:
        problems.append(f"{WEIGHTS_FILE} has keys {fmt} does not know: {unknown}")
    for key in sorted(set(expected) & set(tensors)):
        shape, want = expected[key]
        t = tensors[key]
        if tuple(t.shape) != shape or t.dtype != want:
            problems.append(f"{WEIGHTS_FILE} {key} is {t.dtype} {tuple(t.shape)}, expected {want} {shape}")
        elif t.is_floating_point() and not torch.isfinite(t).all():
            problems.append(f"{WEIGHTS_FILE} {key} holds non-finite values")


def _check_vocab(
    problems: list[str], tensors: dict[str, torch.Tensor], cfg: DraftConfig, draft: Eagle3Draft
) -> None:
    d2t, t2d = tensors["d2t"], tensors["t2d"]
    ids = d2t + torch.arange(d2t.numel())
    if int(t2d.sum()) != cfg.draft_vocab_size:
        problems.append(
            f"t2d marks {int(t2d.sum())} target ids, expected draft_vocab_size {cfg.draft_vocab_size}"
        )
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= cfg.vocab_size):
        problems.append(f"d2t maps to target ids outside 0..{cfg.vocab_size - 1}")
    elif not bool(t2d[ids].all()):
        problems.append("d2t maps draft ids to target ids that t2d does not mark")
    if torch.unique(ids).numel() != ids.numel():
        problems.append("d2t maps two draft ids to the same target id")
    if not torch.equal(d2t, draft.d2t.detach().cpu().to(torch.int64)):
        problems.append("d2t differs from the trained draft's")
    if not torch.equal(t2d, draft.t2d.detach().cpu().to(torch.bool)):
        problems.append("t2d differs from the trained draft's")


def _finish(
    fmt: str,
    out_dir: Path,
    problems: list[str],
    cfg: DraftConfig | None,
    tensors: dict[str, torch.Tensor] | None,
    draft: Eagle3Draft,
    dtype: str,
) -> dict:
    if cfg is not None and tensors is not None:
        _check_tensors(problems, tensors, cfg, fmt, dtype)
        if not problems:
            _check_vocab(problems, tensors, cfg, draft)
            # The logits sample touches few embedding rows; the embedding is the frozen
            # target's, so the stored one must equal it exactly.
            if fmt == VLLM and not torch.equal(tensors[EMBED_KEY], _rounded_embed(draft, dtype)):
                problems.append(
                    f"{WEIGHTS_FILE} {EMBED_KEY} differs from the target embedding the draft uses"
                )
    if problems or cfg is None or tensors is None:
        raise ExportError(f"{out_dir}: {fmt} export is invalid:\n  - " + "\n  - ".join(problems))
    embed = tensors[EMBED_KEY] if fmt == VLLM else _rounded_embed(draft, dtype)
    reloaded = _build_draft(cfg, _by_draft_name(fmt, tensors), embed, torch.float32)
    reference = _build_draft(
        draft.config, _rounded_state(draft, dtype), _rounded_embed(draft, dtype), torch.float32
    )
    got, want = _sample_logits(reloaded), _sample_logits(reference)
    diff = float((got - want).abs().max())
    if not torch.allclose(got, want, atol=LOGITS_ATOL, rtol=LOGITS_RTOL):
        raise ExportError(
            f"{out_dir}: {fmt} export is invalid: a draft rebuilt from the files gives other logits than "
            f"the trained draft (max |diff| {diff:.3g} > {LOGITS_ATOL}); the weights are not the trained ones"
        )
    return {
        "keys": len(tensors),
        "logits_max_abs_diff": diff,
        "logits_tolerance": {"atol": LOGITS_ATOL, "rtol": LOGITS_RTOL},
        "sample": {"tokens": _SAMPLE_TOKENS, "steps": _SAMPLE_STEPS, "seed": _SAMPLE_SEED},
    }


# ---------------------------------------------------------------------------------
# Rebuilding drafts from files
# ---------------------------------------------------------------------------------


def load_sglang_export(
    out_dir: Path, embed_weight: torch.Tensor, *, compute_dtype: str | None = None
) -> Eagle3Draft:
    """An Eagle3Draft from an SGLang export plus the target's embedding (which SGLang shares).

    Weights keep their stored dtype unless `compute_dtype` is given; the embedding is
    cast to the same dtype. Raises ExportError if the files do not hold exactly the
    SGLang keys with the shapes the config implies.
    """
    out_dir = Path(out_dir)
    if compute_dtype is not None and compute_dtype not in DTYPES:
        raise ExportError(f"compute_dtype {compute_dtype!r} is not one of {sorted(DTYPES)}")
    problems: list[str] = []
    config, tensors = _read_export(out_dir, problems)
    cfg = None
    if config is not None:
        _expect(problems, "architectures", config.get("architectures"), [SGLANG_ARCHITECTURE])
        try:
            cfg = _config_from_fields(config)
        except (KeyError, TypeError, ValueError) as exc:
            problems.append(f"config cannot describe a draft: {type(exc).__name__}: {exc}")
    if cfg is not None and tensors is not None:
        stored = str(config.get("torch_dtype"))
        if stored not in DTYPES:
            problems.append(f"config torch_dtype {stored!r} is not one of {sorted(DTYPES)}")
        else:
            _check_tensors(problems, tensors, cfg, SGLANG, stored)
    if problems or cfg is None or tensors is None:
        raise ExportError(f"{out_dir}: cannot load the SGLang export:\n  - " + "\n  - ".join(problems))
    dtype = DTYPES[compute_dtype] if compute_dtype else DTYPES[str(config["torch_dtype"])]
    if tuple(embed_weight.shape) != (cfg.vocab_size, cfg.hidden_size):
        raise ExportError(
            f"embedding shape {tuple(embed_weight.shape)} does not match the export's "
            f"({cfg.vocab_size}, {cfg.hidden_size})"
        )
    return _build_draft(cfg, _by_draft_name(SGLANG, tensors), embed_weight, dtype)


def load_trained_draft(weights: Path, config_file: Path, embed_weight: torch.Tensor) -> Eagle3Draft:
    """The draft rule `train` wrote (SGLang-named weights without the embedding, plus its
    DraftConfig as JSON), with the target's embedding, in float32."""
    from safetensors.torch import load_file

    cfg = DraftConfig(**json.loads(Path(config_file).read_text()))
    return _build_draft(cfg, load_file(str(weights)), embed_weight, torch.float32)


def _config_from_fields(config: dict) -> DraftConfig:
    return DraftConfig(
        hidden_size=int(config["hidden_size"]),
        intermediate_size=int(config["intermediate_size"]),
        num_attention_heads=int(config["num_attention_heads"]),
        num_key_value_heads=int(config["num_key_value_heads"]),
        head_dim=int(config["head_dim"]),
        vocab_size=int(config["vocab_size"]),
        draft_vocab_size=int(config["draft_vocab_size"]),
        max_position_embeddings=int(config["max_position_embeddings"]),
        rms_norm_eps=float(config["rms_norm_eps"]),
        rope_theta=float(config["rope_theta"]),
        target_hidden_size=int(config["target_hidden_size"]),
        rope_scaling=rope_settings(config)[1],  # either form; absent in older exports: plain
    )


def _by_draft_name(fmt: str, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: tensors[key] for name, key in KEY_MAPS[fmt].items() if name != EMBED_KEY}


def _rounded_state(draft: Eagle3Draft, dtype: str) -> dict[str, torch.Tensor]:
    """The trained tensors as the export stores them (rounded to `dtype`), embedding aside."""
    state = draft.state_dict()
    return {name: _cast(name, state[name].detach().cpu(), dtype) for name in KEY_MAPS[SGLANG]}


def _rounded_embed(draft: Eagle3Draft, dtype: str) -> torch.Tensor:
    return draft.embed_tokens.weight.detach().cpu().to(DTYPES[dtype])


def _build_draft(
    cfg: DraftConfig, state: dict[str, torch.Tensor], embed: torch.Tensor, dtype: torch.dtype
) -> Eagle3Draft:
    """An Eagle3Draft holding exactly `state` (+ `embed`), built without random init."""
    with torch.device("meta"):
        model = Eagle3Draft(cfg, torch.empty(cfg.vocab_size, cfg.hidden_size))
    full = {
        name: (t.to(torch.int64) if name == "d2t" else t.to(torch.bool) if name == "t2d" else t.to(dtype))
        for name, t in state.items()
    }
    full[EMBED_KEY] = embed.detach().to("cpu", dtype)
    try:
        model.load_state_dict(full, strict=True, assign=True)
    except RuntimeError as exc:
        raise ExportError(f"the exported tensors do not fit an Eagle3Draft: {exc}") from None
    model.embed_tokens.weight.requires_grad_(False)
    return model.eval()


@torch.no_grad()
def _sample_logits(model: Eagle3Draft) -> torch.Tensor:
    """Logits of `_SAMPLE_STEPS` draft steps on a fixed random input (float32, CPU)."""
    c = model.config
    gen = torch.Generator().manual_seed(_SAMPLE_SEED)
    t = _SAMPLE_TOKENS
    aux = torch.randn(1, t, 3 * _target_hidden(c), generator=gen)
    ids = torch.randint(0, c.vocab_size, (1, t + _SAMPLE_STEPS), generator=gen)
    positions = torch.arange(t)[None]
    hidden = model.fc(aux)
    cache: tuple[list, list] = ([], [])
    out = []
    for j in range(_SAMPLE_STEPS):
        embeds = model.embed_tokens(ids[:, j + 1 : j + 1 + t])
        hidden = model.step(embeds, hidden, positions + j, cache)
        out.append(model.logits(hidden))
    return torch.stack(out).float()
