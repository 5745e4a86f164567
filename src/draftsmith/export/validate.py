"""Validate an export by reloading it: keys, shapes, dtypes, config fields, layer ids,
vocab mapping, and logits of a draft rebuilt from the files against the trained draft.

SGLang silently skips unknown keys and never reports missing ones (the draft then runs
with random weights and acceptance ~1.0), so nothing here may rely on the consumer to
notice a bad file.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from draftsmith.draft.model import DraftConfig, Eagle3Draft
from draftsmith.export.load import (
    _build_draft,
    _by_draft_name,
    _check_tensors,
    _config_from_fields,
    _expect,
    _read_export,
    _target_hidden,
)
from draftsmith.export.names import (
    AUX_LAYER_CONVENTION,
    EMBED_KEY,
    KEY_MAPS,
    SGLANG,
    SGLANG_ARCHITECTURE,
    VLLM,
    VLLM_ARCHITECTURE,
    WEIGHTS_FILE,
    ExportError,
    aux_layer_ids,
)
from draftsmith.target.dtypes import DTYPES
from draftsmith.target.layers import AuxLayers

# The logits check compares float32 computations on identical (dtype-rounded) weights,
# so any difference beyond float noise means the files do not hold the trained draft.
LOGITS_ATOL = 1e-5
LOGITS_RTOL = 1e-5
_SAMPLE_TOKENS = 8
_SAMPLE_STEPS = 2
_SAMPLE_SEED = 1234


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


def _rope_parameters(c: DraftConfig) -> dict:
    return {**(c.rope_scaling or {"rope_type": "default"}), "rope_theta": c.rope_theta}


def _rounded_state(draft: Eagle3Draft, dtype: str) -> dict[str, torch.Tensor]:
    """The trained tensors as the export stores them (rounded to `dtype`), embedding aside."""
    state = draft.state_dict()
    return {name: _cast(name, state[name].detach().cpu(), dtype) for name in KEY_MAPS[SGLANG]}


def _rounded_embed(draft: Eagle3Draft, dtype: str) -> torch.Tensor:
    return draft.embed_tokens.weight.detach().cpu().to(DTYPES[dtype])


def _cast(name: str, tensor: torch.Tensor, dtype: str) -> torch.Tensor:
    if name == "d2t":
        return tensor.to(torch.int64)
    if name == "t2d":
        return tensor.to(torch.bool)
    return tensor.to(DTYPES[dtype])


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
