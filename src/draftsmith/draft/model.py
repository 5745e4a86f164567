"""A Llama-style EAGLE-3 draft and its training-time-test (TTT) loss.

Parameter names are SGLang's (`midlayer.*`, `fc`, `norm`, `lm_head`, buffers `d2t`,
`t2d`) so export needs no renaming for SGLang; `export.py` owns the maps to other
formats. The embedding is the target's and stays frozen; the rotary embedding is the
target's too (`rope.py`), as SGLang and vLLM build it from the exported config.

Positions: the draft at position t reads the fused target feature of position t and
the embedding of token t+1, and predicts the target's distribution at position t+1
(token t+2). TTT step j feeds the draft's own output hidden state back at the same
positions with tokens shifted by j, attends causally to step 0's keys plus, on the
diagonal, to its own keys of steps 1..j (what the draft sees at inference), and its
loss is weighted 0.8**j.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from draftsmith.draft.attention import ttt_attention
from draftsmith.draft.rope import check_scaling, rope_settings, rotary

STEP_DECAY = 0.8


@dataclass
class DraftConfig:
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    draft_vocab_size: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    target_hidden_size: int | None = None
    # The target's RoPE scaling (draft/rope.py); None: plain RoPE, as drafts had before it existed.
    rope_scaling: dict | None = None

    def __post_init__(self) -> None:
        check_scaling(self.rope_scaling)

    @classmethod
    def from_target(cls, text_config, draft_vocab_size: int, max_position_embeddings: int) -> DraftConfig:
        """The draft of a target with this (transformers) text config, with the target's RoPE."""
        rope_theta, rope_scaling = rope_settings(text_config.to_dict())
        heads = text_config.num_attention_heads
        return cls(
            hidden_size=text_config.hidden_size,
            intermediate_size=text_config.intermediate_size,
            num_attention_heads=heads,
            num_key_value_heads=text_config.num_key_value_heads,
            head_dim=getattr(text_config, "head_dim", None) or text_config.hidden_size // heads,
            vocab_size=text_config.vocab_size,
            draft_vocab_size=draft_vocab_size,
            max_position_embeddings=max_position_embeddings,
            rms_norm_eps=text_config.rms_norm_eps,
            rope_theta=rope_theta,
            target_hidden_size=text_config.hidden_size,
            rope_scaling=rope_scaling,
        )

    def as_dict(self) -> dict:
        fields = asdict(self)
        if fields["rope_scaling"] is None:  # plain RoPE: the same draft_config.json as before the field
            del fields["rope_scaling"]
        return fields


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x * cos + rotated * sin).to(x.dtype)


class Attention(nn.Module):
    """Attention whose input is concat(norm(embedding), norm(hidden)): 2H wide."""

    def __init__(self, c: DraftConfig) -> None:
        super().__init__()
        self.c = c
        self.q_proj = nn.Linear(2 * c.hidden_size, c.num_attention_heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(2 * c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(2 * c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.num_attention_heads * c.head_dim, c.hidden_size, bias=False)

    def project(self, x: torch.Tensor, positions: torch.Tensor, rows: torch.Tensor | None = None):
        """q, k, v as (B, heads, T, d), rotary applied. `x` is (B, T, 2H); or, with `rows`
        (flat indices into the B x T positions), (N, 2H) for just those positions, the
        others left zero."""
        c = self.c
        projections = (self.q_proj, self.k_proj, self.v_proj)
        b, t = positions.shape
        if rows is None:
            parts = [proj(x) for proj in projections]
        else:
            parts = [_scatter(proj(x), rows, b, t) for proj in projections]
        q, k, v = (part.view(b, t, -1, c.head_dim).transpose(1, 2) for part in parts)
        cos, sin = rotary(positions, c.head_dim, c.rope_theta, c.rope_scaling)
        cos, sin = cos[:, None], sin[:, None]
        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin), v

    def heads(self, q, keys: list[torch.Tensor], values: list[torch.Tensor]):
        """q attends causally to step 0 (keys[0]) and to its own position in later steps;
        returns the heads' outputs (B, T, heads * d), before o_proj (see attention.py)."""
        out = ttt_attention(q, keys, values)
        b, h, n, d = out.shape
        return out.transpose(1, 2).reshape(b, n, h * d)

    def attend(self, q, keys: list[torch.Tensor], values: list[torch.Tensor]):
        """q attends causally to step 0 (keys[0]) and to its own position in later steps."""
        return self.o_proj(self.heads(q, keys, values))


def _scatter(values: torch.Tensor, rows: torch.Tensor, b: int, t: int) -> torch.Tensor:
    """(N, D) values at the flat positions `rows` of a (B, T, D) tensor, zeros elsewhere."""
    return values.new_zeros(b * t, values.shape[-1]).index_copy(0, rows, values).view(b, t, -1)


def _gather(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """(N, D): the flat positions `rows` of a (B, T, D) tensor. Integer indices, unlike a
    boolean mask, need no host sync."""
    return x.flatten(0, 1).index_select(0, rows)


def flat_indices(masks: list[torch.Tensor]) -> list[torch.Tensor]:
    """Each (B, T) bool mask's True positions as flat indices, for all masks in two host
    syncs (rather than one per boolean index)."""
    stacked = torch.stack([m.reshape(-1) for m in masks])
    counts = stacked.sum(1).tolist()
    return list(stacked.nonzero()[:, 1].split(counts))


class MLP(nn.Module):
    def __init__(self, c: DraftConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MidLayer(nn.Module):
    def __init__(self, c: DraftConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = MLP(c)


class Eagle3Draft(nn.Module):
    def __init__(self, c: DraftConfig, embed_weight: torch.Tensor) -> None:
        super().__init__()
        self.config = c
        self.embed_tokens = nn.Embedding.from_pretrained(embed_weight.clone(), freeze=True)
        self.fc = nn.Linear(3 * c.hidden_size, c.hidden_size, bias=False)
        self.midlayer = MidLayer(c)
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.lm_head = nn.Linear(c.hidden_size, c.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(c.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(c.vocab_size, dtype=torch.bool))

    def set_vocab(self, d2t: torch.Tensor, t2d: torch.Tensor) -> None:
        self.d2t.copy_(d2t)
        self.t2d.copy_(t2d)

    def step(self, embeds, hidden, positions, cache: tuple[list, list], rows: torch.Tensor | None = None):
        """One draft step; appends this step's keys/values to `cache`; returns the new hidden.
        Batches are right-padded (attention is causal and reads no mask).

        `rows` (flat indices into B x T) limits the work to those positions: the others
        keep `hidden` and get zero keys and values. Only for a TTT step after the first,
        where a position's keys are read by that position alone and positions that are
        never scored again need no new state.
        """
        layer = self.midlayer
        attn = layer.self_attn
        if rows is None:
            x = torch.cat([layer.input_layernorm(embeds), layer.hidden_norm(hidden)], dim=-1)
            q, k, v = attn.project(x, positions)
            cache[0].append(k)
            cache[1].append(v)
            h = hidden + attn.attend(q, cache[0], cache[1])
            return h + layer.mlp(layer.post_attention_layernorm(h))
        before = _gather(hidden, rows)
        x = torch.cat([layer.input_layernorm(_gather(embeds, rows)), layer.hidden_norm(before)], dim=-1)
        q, k, v = attn.project(x, positions, rows)
        cache[0].append(k)
        cache[1].append(v)
        h = before + attn.o_proj(_gather(attn.heads(q, cache[0], cache[1]), rows))
        h = h + layer.mlp(layer.post_attention_layernorm(h))
        return hidden.flatten(0, 1).index_copy(0, rows, h).view_as(hidden)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(hidden))


def shift(x: torch.Tensor, by: int) -> torch.Tensor:
    """x[:, t+by] at position t, zero-padded at the end."""
    if by == 0:
        return x
    pad = torch.zeros_like(x[:, :by])
    return torch.cat([x[:, by:], pad], dim=1)


def target_in_vocab(
    draft: Eagle3Draft, full_head: torch.Tensor, final: torch.Tensor, chunk: int = 2048
) -> torch.Tensor:
    """Per position: is the target's argmax (over its whole vocabulary) in the draft vocabulary?

    Looked up in `t2d` at the full-vocabulary argmax (computed in chunks of positions
    to bound memory), so the answer never hinges on two different products agreeing
    to the last bit.
    """
    with torch.no_grad():
        flat = final.reshape(-1, final.shape[-1])
        best = torch.cat([(part.to(full_head.dtype) @ full_head.T).argmax(-1) for part in flat.split(chunk)])
        return draft.t2d[best].reshape(final.shape[:-1])


def _draft_vocab_logits(draft: Eagle3Draft, full_head: torch.Tensor, final: torch.Tensor) -> torch.Tensor:
    draft_ids = draft.d2t + torch.arange(draft.d2t.numel(), device=draft.d2t.device)
    return (final.to(full_head.dtype) @ full_head[draft_ids].T).float()


def valid_positions(
    loss_mask: torch.Tensor, attention_mask: torch.Tensor, in_vocab: torch.Tensor, step: int
) -> torch.Tensor:
    """Positions TTT step `step` is scored on: the token it predicts (t+step+2) is real and
    supervised, and the target's argmax there lies in the draft vocabulary."""
    return (shift(loss_mask, step + 2) * shift(attention_mask, step + 2) * shift(in_vocab, step + 1)).bool()


def ttt_sums(
    draft: Eagle3Draft,
    full_head: torch.Tensor,
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    attention_mask: torch.Tensor,
    aux: torch.Tensor,
    final: torch.Tensor,
    steps: int,
    in_vocab: torch.Tensor | None = None,
    sparse: bool = True,
) -> list[dict]:
    """Per unrolled step: summed (not averaged) loss over valid positions, with its graph,
    plus correct and count.

    Callers that normalise over more than one batch (gradient accumulation, data
    parallel) divide each step's sum by its count over the whole global batch;
    `ttt_loss` divides by this batch's own count. `in_vocab` may be passed when
    already computed (`target_in_vocab`), saving the full-vocabulary product. The
    draft's head and the loss are evaluated at valid positions only, and steps after
    the first at positions still to be scored (`sparse`; False computes every position,
    the reference the tests compare with).
    """
    b, t = input_ids.shape
    with torch.no_grad():
        if in_vocab is None:
            in_vocab = target_in_vocab(draft, full_head, final)
        # The target's distribution is read at position p only when token p+1 is scored.
        needed = in_vocab & shift(loss_mask, 1).bool() & shift(attention_mask, 1).bool()
        valids = [valid_positions(loss_mask, attention_mask, in_vocab, j) for j in range(steps)]
        # Step j (j >= 1) needs only positions scored at step j or later; step 0 computes
        # every position, since every position's step-0 keys are attended to.
        later = [torch.zeros_like(needed)]
        for j in range(steps - 1, 0, -1):
            later.insert(0, later[0] | valids[j])
        needed_at, *indices = flat_indices([needed, *valids, *later[:-1]])
        valid_at = indices[:steps]
        rows: list[torch.Tensor | None] = [None, *indices[steps:]] if sparse else [None] * steps
        row_of = torch.full((b * t,), -1, dtype=torch.long, device=input_ids.device)
        row_of[needed_at] = torch.arange(needed_at.numel(), device=input_ids.device)
        row_of = row_of.view(b, t)
        target_probs = torch.softmax(_draft_vocab_logits(draft, full_head, _gather(final, needed_at)), dim=-1)
    positions = torch.arange(t, device=input_ids.device)[None].expand(b, t)
    hidden = draft.fc(aux)
    cache: tuple[list, list] = ([], [])
    stats = []
    for j in range(steps):
        tokens = shift(input_ids, j + 1)  # token t+j+1 at position t
        embeds = draft.embed_tokens(tokens).to(hidden.dtype)
        hidden = draft.step(embeds, hidden, positions + j, cache, rows[j])
        # The head and the loss only where they count (the hidden state feeds the next step everywhere).
        logits = draft.logits(_gather(hidden, valid_at[j])).float()
        # The target's distribution at t+j+1.
        probs = target_probs.index_select(0, shift(row_of, j + 1).reshape(-1).index_select(0, valid_at[j]))
        per_token = -(probs * torch.log_softmax(logits, dim=-1)).sum(-1)
        correct = (logits.argmax(-1) == probs.argmax(-1)).sum()
        stats.append({"loss_sum": per_token.sum(), "correct": correct.detach(), "count": valids[j].sum()})
    return stats


def ttt_loss(
    draft: Eagle3Draft,
    full_head: torch.Tensor,
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    attention_mask: torch.Tensor,
    aux: torch.Tensor,
    final: torch.Tensor,
    steps: int,
) -> tuple[torch.Tensor, list[dict]]:
    """Weighted TTT loss over `steps` unrolled steps, plus per-step loss, correct and count.

    `full_head` is the target's lm_head weight [vocab, H]; target logits are rebuilt
    from the stored final states and restricted to the draft vocabulary. A position
    counts when its predicted token is supervised and the target's own argmax is in
    the draft vocabulary (the draft cannot be right otherwise).
    """
    sums = ttt_sums(draft, full_head, input_ids, loss_mask, attention_mask, aux, final, steps)
    total = sums[0]["loss_sum"].new_zeros((), dtype=torch.float32)
    stats = []
    for j, step in enumerate(sums):
        loss = step["loss_sum"] / step["count"].clamp(min=1)
        total = total + (STEP_DECAY**j) * loss
        stats.append({"loss": loss.detach(), "correct": step["correct"], "count": step["count"].detach()})
    return total, stats
