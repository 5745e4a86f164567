"""Merge tokenized datasets, cap per dataset, shuffle deterministically by seed."""

from __future__ import annotations

import random


def merge(per_dataset: dict[str, list[dict]], caps: dict[str, int], seed: int) -> tuple[list[dict], dict]:
    """Samples of every dataset (capped by a seeded subsample), shuffled by `seed`.

    Datasets are visited in sorted order and each gets its own generator derived
    from the seed and its name, so adding a dataset never changes which samples
    another dataset contributes.
    """
    merged: list[dict] = []
    taken: dict[str, int] = {}
    for name in sorted(per_dataset):
        samples = per_dataset[name]
        cap = caps.get(name)
        if cap is not None and len(samples) > cap:
            keep = sorted(random.Random(f"{seed}:{name}").sample(range(len(samples)), cap))
            samples = [samples[i] for i in keep]
        taken[name] = len(samples)
        merged.extend(samples)
    random.Random(seed).shuffle(merged)
    return merged, taken
