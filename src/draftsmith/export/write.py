"""Write an export: a trained EAGLE-3 draft as an SGLang or a vLLM (speculators) draft
directory, validated.

An export counts as done only after validation: the draft's RoPE must be the target's, and
the files are written into a temp directory beside the target, reloaded and checked
(`validate`), and renamed into place only then.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import save_file

from draftsmith.draft.model import DraftConfig, Eagle3Draft
from draftsmith.draft.rope import RopeError, rope_settings
from draftsmith.export.load import _target_hidden
from draftsmith.export.names import (
    AUX_LAYER_CONVENTION,
    CONFIG_FILE,
    KEY_MAPS,
    MANIFEST_FILE,
    SGLANG,
    SGLANG_ARCHITECTURE,
    SPECULATORS_VERSION,
    VLLM,
    VLLM_ARCHITECTURE,
    WEIGHTS_FILE,
    ExportError,
    aux_layer_ids,
)
from draftsmith.export.validate import _cast, _rope_parameters, validate_sglang, validate_vllm
from draftsmith.fsutil.atomic import atomic_dir
from draftsmith.fsutil.digests import sha256_file
from draftsmith.target.dtypes import DTYPES
from draftsmith.target.layers import AuxLayers


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


def _max_positions(c: DraftConfig, text: dict, serving_context: int) -> int:
    # Below the served context a draft loses acceptance (2048 gave near-zero in a public
    # report); above it costs the server only a longer RoPE cache, as model.py has none.
    return max(c.max_position_embeddings, serving_context, int(text.get("max_position_embeddings") or 0))


def _rope_fields(theta: float, scaling: dict | None) -> dict:
    """RoPE settings as flat fields (rope_scaling.factor, ...), to name the one that differs."""
    return {"rope_theta": theta, **{f"rope_scaling.{key}": value for key, value in (scaling or {}).items()}}


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
