"""The held-out split of the merged data: one rule, used by the vocabulary and training.

A sample is held out for validation when the hash of its id falls below
`val_fraction`, so the split depends on the id alone: the same sample is on the same
side for every seed, shard count and config that shares it. If that leaves no sample
held out while `val_fraction > 0`, the sample of smallest hash is (so a small data set
still gets a validation figure).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable


def id_fraction(sample_id: str) -> float:
    """A stable number in [0, 1) for a sample id (first 8 bytes of its sha256)."""
    digest = hashlib.sha256(sample_id.encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def held_out_ids(ids: Iterable[str], val_fraction: float) -> set[str]:
    """The ids held out for validation (see the module docstring)."""
    ids = list(ids)
    held = {i for i in ids if id_fraction(i) < val_fraction}
    if not held and val_fraction > 0 and len(ids) > 1:
        held = {min(ids, key=id_fraction)}
    return held
