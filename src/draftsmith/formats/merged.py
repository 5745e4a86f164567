"""The held-out split of the merged data: one rule, used by the vocabulary and training.

A sample is held out for validation when the hash of its conversation's id falls below
`val_fraction`, so the split depends on the id alone: the same sample is on the same
side for every seed, shard count and config that shares it. If that leaves no sample
held out while `val_fraction > 0`, the sample of smallest hash is (so a small data set
still gets a validation figure).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable


def conversation_of(sample_id: str) -> str:
    """The conversation a sample belongs to: the turns of one conversation
    (`<id>/<turn>`, `responses.turns.turn_id`) are on one side of the split."""
    return sample_id.split("/", 1)[0]


def id_fraction(sample_id: str) -> float:
    """A stable number in [0, 1) for a sample's conversation (first 8 bytes of its sha256)."""
    digest = hashlib.sha256(conversation_of(sample_id).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def held_out_ids(ids: Iterable[str], val_fraction: float) -> set[str]:
    """The ids held out for validation (see the module docstring)."""
    ids = list(ids)
    held = {i for i in ids if id_fraction(i) < val_fraction}
    if not held and val_fraction > 0 and len(ids) > 1:
        first = conversation_of(min(ids, key=id_fraction))
        held = {i for i in ids if conversation_of(i) == first}
    return held
