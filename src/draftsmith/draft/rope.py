"""The draft's rotary embedding: the target's RoPE settings, computed by transformers.

A draft trained with plain RoPE for a target with scaled RoPE (llama3, yarn, linear,
longrope...) sees other positions than the target beyond the original context, and
acceptance collapses there; SGLang and vLLM build a served draft's RoPE from its config
anyway. So the draft carries the target's settings, as `rope_theta` plus a `rope_scaling`
dict (what SGLang's Llama layer reads; None means plain RoPE), and gets its inverse
frequencies and cos/sin scale (`attention_scaling`) from transformers'
`ROPE_INIT_FUNCTIONS`, as `LlamaRotaryEmbedding` does, not from a copy of the formulas.

Types that depend on the sequence length: `longrope` takes its long factors for a whole
call once its largest position passes the original context, as transformers does.
`dynamic` NTK keeps state across calls in transformers (it grows with the longest
sequence seen and resets only below the original context) and is static in SGLang and
vLLM, so no draft RoPE matches the target's: it is refused.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from typing import Any

import torch

from draftsmith.errors import DraftsmithError

DEFAULT_THETA = 10000.0
# Types that are plain RoPE along the draft's 1-D text positions.
PLAIN_TYPES = frozenset({"default", "mrope"})
ORIGINAL = "original_max_position_embeddings"
# Keys that shape no scaling of the draft's layer: theta is a field of its own, the old
# name of rope_type, and partial or multimodal rotation (the draft is a Llama layer that
# rotates its whole head along text positions).
_NOT_SCALING = frozenset(
    {"rope_theta", "type", "partial_rotary_factor", "mrope_section", "mrope_interleaved"}
)
# Settings transformers derives from max_position_embeddings when a config lacks them; a
# draft's must be explicit, as its max_position_embeddings is not the target's.
_DERIVED = {"llama3": (ORIGINAL,), "yarn": (ORIGINAL, "factor"), "longrope": (ORIGINAL, "factor")}


class RopeError(DraftsmithError, ValueError):
    """RoPE settings a draft cannot reproduce."""


def rope_settings(config: Mapping[str, Any]) -> tuple[float, dict | None]:
    """(rope_theta, rope_scaling) of a config.json-like mapping, in either form: `rope_scaling`
    plus `rope_theta` (older configs), or transformers 5's `rope_parameters`.

    rope_scaling is None for plain RoPE, else the scaling parameters with `rope_type` and
    with what transformers derives from the rest of the config made explicit (the original
    context; a yarn or longrope factor as max / original context), so the settings mean
    the same in a draft config whose max_position_embeddings is another.
    """
    params = _full_attention(config.get("rope_scaling") or config.get("rope_parameters") or {})
    theta = params.get("rope_theta") or config.get("rope_theta") or DEFAULT_THETA
    rope_type = params.get("rope_type") or params.get("type") or "default"
    if rope_type in PLAIN_TYPES:
        return theta, None
    scaling = {key: value for key, value in params.items() if key not in _NOT_SCALING}
    scaling["rope_type"] = rope_type
    derived = _DERIVED.get(rope_type, ())
    if ORIGINAL in derived:
        if config.get(ORIGINAL) is not None:  # Phi-3 keeps it beside; transformers prefers that one
            scaling[ORIGINAL] = config[ORIGINAL]
        elif scaling.get(ORIGINAL) is None:
            scaling[ORIGINAL] = _field(config, "max_position_embeddings", rope_type)
    if "factor" in derived and scaling.get("factor") is None:
        scaling["factor"] = _field(config, "max_position_embeddings", rope_type) / scaling[ORIGINAL]
    check_scaling(scaling)
    return theta, scaling


def _full_attention(params: dict) -> dict:
    """RoPE per layer type (Gemma 3): the full-attention layers', as the draft's one layer
    attends over the whole context."""
    if not any(isinstance(value, dict) for value in params.values()):
        return params
    if isinstance(params.get("full_attention"), dict):
        return params["full_attention"]
    raise RopeError(
        f"RoPE per layer type {sorted(params)} has no full_attention entry; the draft's single "
        "full-attention layer needs one"
    )


def _field(config: Mapping[str, Any], name: str, rope_type: str) -> Any:
    if config.get(name) is None:
        raise RopeError(f"rope_type {rope_type!r} needs {name} in the config, which has none")
    return config[name]


def check_scaling(scaling: dict | None) -> None:
    """Refuse a rope_scaling the draft cannot compute as transformers does."""
    if scaling is None:
        return
    rope_type = scaling.get("rope_type") if isinstance(scaling, dict) else None
    if not isinstance(rope_type, str):
        raise RopeError(f"rope_scaling must be a mapping with a rope_type (None: plain), got {scaling!r}")
    if "dynamic" in rope_type:  # transformers' own test for its stateful update
        raise RopeError(
            f"rope_type {rope_type!r} is refused: transformers rescales it with the longest sequence "
            "seen so far (state kept across calls) while SGLang and vLLM scale it once for the whole "
            "context, so no draft RoPE matches the target's in both"
        )
    known = _init_functions()
    if rope_type not in known:
        raise RopeError(
            f"rope_type {rope_type!r} is not one transformers computes ({sorted(known)}); "
            "use rope_scaling None for plain RoPE"
        )
    missing = [key for key in _DERIVED.get(rope_type, ()) if scaling.get(key) is None]
    if missing:
        raise RopeError(
            f"rope_scaling of type {rope_type!r} lacks {missing}: a draft's must be explicit "
            "(rope_settings derives them from the target's config)"
        )


def _init_functions() -> dict:
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    return ROPE_INIT_FUNCTIONS


def rotary(
    positions: torch.Tensor, head_dim: int, theta: float, scaling: dict | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin (positions.shape + (head_dim,)), float32, as LlamaRotaryEmbedding gives them."""
    attention_scaling = None
    if scaling is None:
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device).float() / head_dim))
    else:
        inv_freq, long_inv_freq, original, attention_scaling = _frequencies(
            head_dim, theta, json.dumps(scaling, sort_keys=True), str(positions.device)
        )
        if long_inv_freq is not None:  # chosen on the device, as transformers does: no host sync
            inv_freq = torch.where(positions.max() + 1 > original, long_inv_freq, inv_freq)
    angles = positions.float()[..., None] * inv_freq
    emb = torch.cat([angles, angles], dim=-1)
    cos, sin = emb.cos(), emb.sin()
    if attention_scaling is None:
        return cos, sin
    return cos * attention_scaling, sin * attention_scaling


@functools.lru_cache(maxsize=32)
def _frequencies(
    head_dim: int, theta: float, scaling_json: str, device: str
) -> tuple[torch.Tensor, torch.Tensor | None, int, float]:
    """inv_freq, longrope's long-context inv_freq (else None), the context beyond which it
    applies, and attention_scaling, from transformers' RoPE initialisation."""
    from transformers import LlamaConfig

    scaling = json.loads(scaling_json)
    rope_type = scaling["rope_type"]
    original = scaling.get(ORIGINAL)
    factor = scaling.get("factor")
    # With the factor and original context explicit (rope_settings), max_position_embeddings
    # feeds only transformers' consistency warnings: give the value they expect.
    context = max(int(original * factor), original + 1) if original and factor else 2048
    config = LlamaConfig(
        hidden_size=head_dim,
        num_attention_heads=1,
        num_key_value_heads=1,
        head_dim=head_dim,
        max_position_embeddings=context,
        rope_parameters={**scaling, "rope_theta": theta},
    )
    init = _init_functions()[rope_type]
    with torch.device("cpu"):  # never the meta device a draft may be built under
        inv_freq, attention_scaling = init(config)
        long_inv_freq = init(config, seq_len=original + 1)[0] if rope_type == "longrope" else None
    inv_freq = inv_freq.to(device)
    if long_inv_freq is not None:
        long_inv_freq = long_inv_freq.to(device)
    return inv_freq, long_inv_freq, original or 0, float(attention_scaling)
