"""Draft vocabulary: the most frequent supervised target tokens, as d2t offsets and a t2d mask.

`d2t[i] = draft_to_target[i] - i` (offsets, as SGLang and vLLM store them) and `t2d`
is a bool mask over the target vocabulary. The selected ids are sorted; if the data
has fewer distinct supervised tokens than `draft_vocab_size`, the rest is padded with
the smallest unused target ids.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

import torch


def count_supervised(samples: Iterable[dict]) -> Counter:
    counts: Counter = Counter()
    for sample in samples:
        counts.update(t for t, m in zip(sample["input_ids"], sample["loss_mask"], strict=True) if m)
    return counts


def build(counts: Counter, draft_vocab_size: int, target_vocab_size: int) -> dict[str, torch.Tensor]:
    if draft_vocab_size > target_vocab_size:
        raise ValueError(
            f"draft_vocab_size {draft_vocab_size} exceeds the target vocabulary {target_vocab_size}"
        )
    ranked = sorted(counts, key=lambda t: (-counts[t], t))[:draft_vocab_size]
    chosen = set(ranked)
    padding = (t for t in range(target_vocab_size) if t not in chosen)
    while len(chosen) < draft_vocab_size:
        chosen.add(next(padding))
    draft_to_target = torch.tensor(sorted(chosen), dtype=torch.long)
    t2d = torch.zeros(target_vocab_size, dtype=torch.bool)
    t2d[draft_to_target] = True
    d2t = draft_to_target - torch.arange(draft_vocab_size)
    return {"d2t": d2t, "t2d": t2d}


def draft_to_target(d2t: torch.Tensor) -> torch.Tensor:
    return d2t + torch.arange(d2t.numel(), device=d2t.device)


def coverage(counts: Counter, t2d: torch.Tensor) -> float:
    """Share of supervised tokens whose id is in the draft vocabulary."""
    total = sum(counts.values())
    return sum(c for t, c in counts.items() if t2d[t]) / total if total else 0.0
