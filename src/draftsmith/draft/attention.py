"""The draft's training-time-test attention, on SDPA's fused attention kernels.

TTT step j's query at position t attends causally to step 0's keys and, on the
diagonal, to its own keys of steps 1..j (what the draft sees at inference). Feeding
all those keys to one masked attention would cost j+1 full attentions, nearly all of
it masked out. Instead the causal part runs in a fused kernel that also returns each
row's log-sum-exp, and the j diagonal scores join through it. The backward pass gives
the kernel the merged output and log-sum-exp, which makes its gradients those of the
whole softmax (ring attention merges blocks across devices the same way), and adds
the diagonal terms.

Rows attend causally, so batches are right-padded: a real position never sees a
padded key, and padded positions are never scored.
"""

from __future__ import annotations

import torch

aten = torch.ops.aten


class _CpuFlash:
    """SDPA's flash kernel for the CPU (float32, float64, bfloat16, float16)."""

    @staticmethod
    def forward(q, k, v, scale):
        out, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, True, scale=scale)
        return out, lse, ()

    @staticmethod
    def backward(d_out, q, k, v, out, lse, state, scale):
        return aten._scaled_dot_product_flash_attention_for_cpu_backward(
            d_out, q, k, v, out, lse, 0.0, True, scale=scale
        )


class _CudaFlash:
    """FlashAttention-2 through SDPA (CUDA, bfloat16 and float16)."""

    @staticmethod
    def forward(q, k, v, scale):
        out, lse, cum_q, cum_k, max_q, max_k, seed, offset, _ = aten._scaled_dot_product_flash_attention(
            q, k, v, 0.0, True, False, scale=scale
        )
        return out, lse, (cum_q, cum_k, max_q, max_k, seed, offset)

    @staticmethod
    def backward(d_out, q, k, v, out, lse, state, scale):
        cum_q, cum_k, max_q, max_k, seed, offset = state
        return aten._scaled_dot_product_flash_attention_backward(
            d_out, q, k, v, out, lse, cum_q, cum_k, max_q, max_k, 0.0, True, seed, offset, scale=scale
        )


class _CudaEfficient:
    """The memory-efficient kernel through SDPA (CUDA, float32); its log-sum-exp rows are
    padded to a multiple of 32."""

    @staticmethod
    def forward(q, k, v, scale):
        out, lse, seed, offset = aten._scaled_dot_product_efficient_attention(
            q, k, v, None, True, 0.0, True, scale=scale
        )
        return out, lse[..., : q.shape[2]], (lse.shape[-1], seed, offset)

    @staticmethod
    def backward(d_out, q, k, v, out, lse, state, scale):
        width, seed, offset = state
        padded = lse.new_zeros(*lse.shape[:-1], width)
        padded[..., : lse.shape[-1]] = lse
        dq, dk, dv, _ = aten._scaled_dot_product_efficient_attention_backward(
            d_out, q, k, v, None, out, padded, seed, offset, 0.0, [True, True, True, False], True, scale=scale
        )
        return dq, dk, dv


def _kernel(q: torch.Tensor):
    if q.device.type == "cpu":
        return _CpuFlash
    if q.device.type == "cuda":
        return _CudaFlash if q.dtype in (torch.bfloat16, torch.float16) else _CudaEfficient
    raise NotImplementedError(f"TTT attention has no fused kernel for device {q.device.type}")


def _grouped(q: torch.Tensor, groups: int) -> torch.Tensor:
    """(B, h, T, d) as (B, h/groups, groups, T, d): query heads beside their key head."""
    b, h, t, d = q.shape
    return q.view(b, h // groups, groups, t, d)


def _ungroup(x: torch.Tensor) -> torch.Tensor:
    """(B, h/groups, groups, T, d) back to (B, h, T, d)."""
    return x.flatten(1, 2)


def _diagonal_scores(q, keys, groups: int, scale: float) -> torch.Tensor:
    """(B, h, T, j) float32 (or float64) scores of each position against its own later keys."""
    acc = torch.promote_types(q.dtype, torch.float32)
    qg = _grouped(q, groups).to(acc)
    scores = [(qg * k[:, :, None].to(acc)).sum(-1) for k in keys]
    return torch.stack(scores, dim=-1).flatten(1, 2) * scale


class _TTTAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k0, v0, *diagonal):
        j = len(diagonal) // 2
        keys, values = diagonal[:j], diagonal[j:]
        groups = q.shape[1] // k0.shape[1]
        scale = q.shape[-1] ** -0.5
        kernel = _kernel(q)
        with torch.autocast(q.device.type, enabled=False):
            k_full, v_full = (x.repeat_interleave(groups, dim=1) for x in (k0, v0))
            out, lse, state = kernel.forward(q, k_full, v_full, scale)
            if j:
                acc = lse.dtype
                scores = _diagonal_scores(q, keys, groups, scale)
                lse0, lse = lse, torch.logaddexp(lse, scores.logsumexp(-1))
                weights = torch.exp(scores - lse[..., None])
                mixed = torch.exp(lse0 - lse)[..., None] * out.to(acc)
                for i, v in enumerate(values):
                    mixed = mixed + _ungroup(_grouped(weights[..., i, None], groups) * v[:, :, None].to(acc))
                out = mixed.to(q.dtype)
        ctx.save_for_backward(q, k0, v0, out, lse, *keys, *values)
        ctx.kernel, ctx.state, ctx.groups, ctx.scale = kernel, state, groups, scale
        return out

    @staticmethod
    def backward(ctx, d_out):
        q, k0, v0, out, lse, *diagonal = ctx.saved_tensors
        j = len(diagonal) // 2
        keys, values = diagonal[:j], diagonal[j:]
        groups, scale = ctx.groups, ctx.scale
        d_out = d_out.to(out.dtype).contiguous()
        k_full, v_full = (x.repeat_interleave(groups, dim=1) for x in (k0, v0))
        dq, dk, dv = ctx.kernel.backward(d_out, q, k_full, v_full, out, lse, ctx.state, scale)
        dk0, dv0 = (x.unflatten(1, (-1, groups)).sum(2) for x in (dk, dv))
        if not j:
            return dq, dk0, dv0
        acc = lse.dtype
        # The diagonal part of d scores = p * (d_out . v - rowsum(d_out * out)).
        weights = torch.exp(_diagonal_scores(q, keys, groups, scale) - lse[..., None])
        d_outg = _grouped(d_out.to(acc), groups)
        shift = (d_out.to(acc) * out.to(acc)).sum(-1)
        dq = dq.to(acc)
        d_keys, d_values = [], []
        for i, (k, v) in enumerate(zip(keys, values, strict=True)):
            p = _grouped(weights[..., i, None], groups)
            d_values.append((p * d_outg).sum(2).to(v.dtype))
            dp = (d_outg * v[:, :, None].to(acc)).sum(-1, keepdim=True)
            ds = p * (dp - _grouped(shift[..., None], groups)) * scale
            dq = dq + _ungroup(ds * k[:, :, None].to(acc))
            d_keys.append((ds * _grouped(q.to(acc), groups)).sum(2).to(k.dtype))
        return dq.to(q.dtype), dk0.to(k0.dtype), dv0.to(v0.dtype), *d_keys, *d_values


def ttt_attention(q: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor]) -> torch.Tensor:
    """Step j's attention (j = len(keys) - 1): `q` (B, h, T, d) causally over `keys[0]`, plus
    keys[i][t] for i >= 1 at each position t. Keys and values have h or fewer (grouped)
    heads, and the dtype of `q`. Returns (B, h, T, d)."""
    return _TTTAttention.apply(q, keys[0], values[0], *keys[1:], *values[1:])
