"""Attention for the decode steps of batched generation: one matmul per key-value group.

A decode step has one query per row against the whole padded key cache. Through SDPA,
with the padding mask every such batch needs, transformers 5.17 repeats the keys and
values for each query head of a group (a copy of the cache per layer and step), and
the memory-efficient kernel tiles the single query as if it were 64 rows; both grow
with batch x cache length, and together they took most of a decode step at batch
2,048 (bench/generate_throughput.py --profile). Here a group's query heads are
multiplied by their shared keys and values directly, the softmax in float32.

Prefill (more than one query) and scores altered by soft-capping or a position bias go
to transformers' own SDPA function, so only the decode step's arithmetic differs, by
rounding. The mask is SDPA's (`register`): boolean, or None without padding.
`use_grouped_decode` switches a loaded model to it for the duration of a block.
"""

from __future__ import annotations

import contextlib
import math

import torch

NAME = "draftsmith_grouped_decode"


def grouped_decode_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function interface: query (B, H, q, d), key and value
    (B, KV, T, d), a boolean mask (B, 1, q, T) or None; returns (B, q, H, d)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    batch, heads, queries, dim = query.shape
    kv_heads = key.shape[1]
    # Logit soft-capping or a position bias change the scores: SDPA's function handles or refuses them.
    altered = kwargs.get("softcap") is not None or kwargs.get("position_bias") is not None
    if queries != 1 or altered:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    scale = scaling if scaling is not None else 1.0 / math.sqrt(dim)
    grouped = query.view(batch, kv_heads, heads // kv_heads, dim)
    scores = torch.matmul(grouped, key.transpose(-1, -2)).float() * scale  # (B, KV, group, T)
    if attention_mask is not None:
        scores = scores.masked_fill(~attention_mask, float("-inf"))
    out = torch.matmul(scores.softmax(-1).to(value.dtype), value)  # (B, KV, group, d)
    return out.reshape(batch, 1, heads, dim), None


def register() -> None:
    """Make `NAME` known to transformers, with SDPA's mask format (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, grouped_decode_attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)


@contextlib.contextmanager
def use_grouped_decode(model):
    """`model` attends with `grouped_decode_attention` inside the block, as before after it."""
    register()
    previous = model.config._attn_implementation
    model.set_attn_implementation(NAME)
    try:
        yield model
    finally:
        model.set_attn_implementation(previous)
