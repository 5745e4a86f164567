"""Load an export: an Eagle3Draft rebuilt from an SGLang export or from the draft rule
`train` wrote, and what reading one needs (the files, the keys, shapes and dtypes a consumer
expects, the DraftConfig a config describes).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from draftsmith.draft.model import DraftConfig, Eagle3Draft
from draftsmith.draft.rope import rope_settings
from draftsmith.export.names import (
    CONFIG_FILE,
    EMBED_KEY,
    KEY_MAPS,
    SGLANG,
    SGLANG_ARCHITECTURE,
    WEIGHTS_FILE,
    ExportError,
)
from draftsmith.target.dtypes import DTYPES


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


# ---------------------------------------------------------------------------------
# Rebuilding drafts from files
# ---------------------------------------------------------------------------------


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


def _target_hidden(c: DraftConfig) -> int:
    return c.target_hidden_size or c.hidden_size
