"""The draft's training-time-test attention, without a T x T score matrix in memory.

TTT step j's query at position t attends causally to step 0's keys and, on the
diagonal, to its own keys of steps 1..j. Feeding all those keys to one attention call
(masked) makes step j cost j+1 full attentions, nearly all of it masked out. Instead,
step 0's causal part runs in query chunks that keep only their output and
log-sum-exp (recomputing scores in the backward pass, as flash attention does), and
the j diagonal scores join through that log-sum-exp, which is differentiable here.
"""

from __future__ import annotations

import torch

# Scores held at once per chunk (fp32 elements): bounds the transient memory (~1 GiB).
CHUNK_ELEMENTS = 1 << 28


def _chunk_rows(q: torch.Tensor, keys: int) -> int:
    b, h, _, _ = q.shape
    return max(16, CHUNK_ELEMENTS // max(1, b * h * keys))


class _CausalAttention(torch.autograd.Function):
    """(output, log-sum-exp) of softmax(q k^T * scale + bias) v, by query chunks; query
    chunk [s, e) reads keys [0, e) only (the bias masks the rest: causal)."""

    @staticmethod
    def forward(ctx, q, k, v, bias):
        scale = q.shape[-1] ** -0.5
        t = q.shape[2]
        rows = _chunk_rows(q, t)
        out = torch.empty_like(q)
        lse = torch.empty(q.shape[:-1], dtype=_acc(q), device=q.device)
        for start in range(0, t, rows):
            end = min(start + rows, t)
            scores = _scores(q[:, :, start:end], k[:, :, :end], bias[:, :, start:end, :end], scale)
            top = scores.amax(-1, keepdim=True)
            weights = torch.exp(scores - top)
            total = weights.sum(-1, keepdim=True)
            out[:, :, start:end] = (weights / total).to(v.dtype) @ v[:, :, :end]
            lse[:, :, start:end] = (top + total.log()).squeeze(-1)
        ctx.save_for_backward(q, k, v, bias, out, lse)
        return out, lse

    @staticmethod
    def backward(ctx, d_out, d_lse):
        q, k, v, bias, out, lse = ctx.saved_tensors
        scale = q.shape[-1] ** -0.5
        t = q.shape[2]
        rows = _chunk_rows(q, t)
        d_out = torch.zeros_like(out) if d_out is None else d_out.to(out.dtype)
        acc = _acc(q)
        d_lse = torch.zeros_like(lse) if d_lse is None else d_lse.to(acc)
        # d scores = p * (d_out . v - rowsum(d_out * out) + d_lse)
        shift = (d_out.to(acc) * out.to(acc)).sum(-1) - d_lse
        dq = torch.empty_like(q)
        dk = torch.zeros(k.shape, dtype=acc, device=k.device)
        dv = torch.zeros(v.shape, dtype=acc, device=v.device)
        for start in range(0, t, rows):
            end = min(start + rows, t)
            q_c, k_c, v_c, d_c = q[:, :, start:end], k[:, :, :end], v[:, :, :end], d_out[:, :, start:end]
            scores = _scores(q_c, k_c, bias[:, :, start:end, :end], scale)
            p = torch.exp(scores - lse[:, :, start:end, None])
            dv[:, :, :end] += (p.to(v.dtype).transpose(-1, -2) @ d_c).to(acc)
            dp = (d_c @ v_c.transpose(-1, -2)).to(acc)
            ds = (p * (dp - shift[:, :, start:end, None]) * scale).to(q.dtype)
            dq[:, :, start:end] = ds @ k_c
            dk[:, :, :end] += (ds.transpose(-1, -2) @ q_c).to(acc)
        return dq, dk.to(k.dtype), dv.to(v.dtype), None


def _acc(x: torch.Tensor) -> torch.dtype:
    """Softmax arithmetic in float32, or in float64 for float64 inputs."""
    return torch.promote_types(x.dtype, torch.float32)


def _scores(q: torch.Tensor, k: torch.Tensor, bias: torch.Tensor, scale: float) -> torch.Tensor:
    return (q @ k.transpose(-1, -2)).to(_acc(q)) * scale + bias.to(_acc(q))


def ttt_attention(
    q: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor], causal: torch.Tensor
) -> torch.Tensor:
    """Step j's attention (j = len(keys) - 1): `q` (B, h, T, d) over `keys[0]` with the
    additive `causal` bias (B, 1, T, T), plus keys[i][t] for i >= 1 at each position t.
    Keys and values have h or fewer (grouped) heads. Returns (B, h, T, d)."""
    groups = q.shape[1] // keys[0].shape[1]
    k0, v0 = (x.repeat_interleave(groups, dim=1) for x in (keys[0], values[0]))
    out, lse = _CausalAttention.apply(q, k0, v0, causal.expand(q.shape[0], 1, -1, -1))
    if len(keys) == 1:
        return out
    scale = q.shape[-1] ** -0.5
    acc = _acc(q)
    diag = torch.stack(
        [(q * k.repeat_interleave(groups, dim=1)).sum(-1).to(acc) * scale for k in keys[1:]], dim=-1
    )
    diag_values = torch.stack([v.repeat_interleave(groups, dim=1) for v in values[1:]], dim=-2)
    top = torch.maximum(lse, diag.amax(-1))
    w0 = torch.exp(lse - top)[..., None]
    w = torch.exp(diag - top[..., None])
    mixed = w0 * out.to(acc) + (w[..., None] * diag_values.to(acc)).sum(-2)
    return (mixed / (w0 + w.sum(-1, keepdim=True))).to(q.dtype)
