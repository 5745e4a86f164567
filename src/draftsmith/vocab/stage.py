"""Rule `vocab`: the draft vocabulary from the supervised tokens of the training split."""

from __future__ import annotations

import json
import logging
import time
from collections import Counter

import numpy as np
from safetensors.torch import save as save_tensors

from draftsmith.draft import vocab as draft_vocab
from draftsmith.errors import DataError
from draftsmith.formats.merged import held_out_ids
from draftsmith.fsutil import atomic
from draftsmith.store import manifest
from draftsmith.store.plan import Artifact
from draftsmith.target.load import model_info
from draftsmith.vocab.settings import VocabSettings

log = logging.getLogger(__name__)


def vocab(
    settings: VocabSettings, artifact: Artifact, inputs: dict, outputs: dict, log_file: str | None = None
) -> dict:
    """Held-out samples (the split training validates on) do not count."""
    started = time.time()
    size, val_fraction = settings.draft_vocab_size, settings.val_fraction
    vocab_size = model_info(inputs["model"])["vocab_size"]
    merged = inputs["merged"]
    # Two passes: the split needs every id first, and counting must not hold the data.
    held = held_out_ids((s["id"] for s in atomic.read_jsonl(merged)), val_fraction)
    counts = np.zeros(vocab_size, dtype=np.int64)
    samples = 0
    for line, sample in enumerate(atomic.read_jsonl(merged), 1):
        samples += 1
        if sample["id"] in held:
            continue
        ids = np.asarray(sample["input_ids"], dtype=np.int64)
        supervised = ids[np.asarray(sample["loss_mask"], dtype=bool)]
        if supervised.size and (supervised.min() < 0 or supervised.max() >= vocab_size):
            raise DataError(
                f"sample {sample['id']} has ids outside the vocabulary", merged, line, "input_ids"
            )
        counts += np.bincount(supervised, minlength=vocab_size)
    counter = Counter({int(t): int(counts[t]) for t in np.flatnonzero(counts)})
    if not counter:
        raise DataError("no supervised token in the training split", merged)
    tensors = draft_vocab.build(counter, size, vocab_size)
    info = {
        "draft_vocab_size": size,
        "target_vocab_size": vocab_size,
        "coverage": draft_vocab.coverage(counter, tensors["t2d"]),
        "distinct_tokens": len(counter),
        "padded": max(0, size - len(counter)),
        "supervised_tokens": int(counts.sum()),
        "train_samples": samples - len(held),
        "held_out_samples": len(held),
        "val_fraction": val_fraction,
    }
    with atomic.atomic_open(outputs["vocab"], "wb") as handle:
        handle.write(save_tensors(tensors))
    atomic.write_json(outputs["info"], info)
    manifest.write(artifact, outputs["manifest"], [outputs["vocab"], outputs["info"]], info, started)
    log.info("draft vocabulary: %s", json.dumps(info))
    return info
