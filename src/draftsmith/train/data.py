"""Training data for the draft: the held-out split, the epoch plan and padded micro-batches.

- Split: `formats.merged.held_out_ids` (the one held-out rule).
- Epoch plan (`TrainData.epoch_batches`): epoch e visits the shards in a seeded
  order, each shard's training samples in a seeded permutation
  (`ShardReader.order`); consecutive windows of that stream are sorted by length
  and packed into micro-batches of at most `batch_tokens` padded tokens (longest x
  count), and each window's micro-batches are shuffled. A window holds at least
  `SORT_WINDOW` samples and at least `WINDOW_BATCHES` micro-batches' worth of
  tokens: with large batches, a fixed sample count would leave them half padding.
  Everything is derived from (seed, epoch) and the shard indexes, never from a
  random state, so a data position is just (epoch, offset): the index of the next
  micro-batch in that epoch's plan.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from draftsmith.errors import DraftsmithError
from draftsmith.formats.merged import held_out_ids
from draftsmith.formats.shards import ShardReader

# Samples sorted by length together before packing: large enough that padding is
# small, small enough that the order stays well mixed. At batch_tokens 65,536 and
# ~210-token samples, 256 samples filled micro-batches to 55% with real tokens, 32
# batches' worth of tokens to 96%.
SORT_WINDOW = 256
WINDOW_BATCHES = 32


class TrainDataError(DraftsmithError):
    pass


def derived_seed(*parts: int | str) -> int:
    """A 63-bit seed from several parts (seed, epoch, shard), independent for each tuple."""
    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def pack(items: list[tuple[int, int]], lengths: dict[tuple[int, int], int], budget: int) -> list[list]:
    """Greedy packing of items (already in order) into batches of at most `budget` padded tokens."""
    batches: list[list] = []
    current: list = []
    longest = 0
    for item in items:
        size = lengths[item]
        if current and max(longest, size) * (len(current) + 1) > budget:
            batches.append(current)
            current, longest = [], 0
        current.append(item)
        longest = max(longest, size)
    if current:
        batches.append(current)
    return batches


def sort_windows(
    stream: list[tuple[int, int]], lengths: dict[tuple[int, int], int], batch_tokens: int
) -> Iterable[list[tuple[int, int]]]:
    """Consecutive slices of `stream`, each at least `SORT_WINDOW` samples and
    `WINDOW_BATCHES` batches' worth of tokens (the last may be smaller)."""
    least_tokens = WINDOW_BATCHES * batch_tokens
    window: list[tuple[int, int]] = []
    tokens = 0
    for item in stream:
        window.append(item)
        tokens += lengths[item]
        if len(window) >= SORT_WINDOW and tokens >= least_tokens:
            yield window
            window, tokens = [], 0
    if window:
        yield window


@dataclass
class Position:
    """Where the next micro-batch comes from: `offset` indexes epoch `epoch`'s plan."""

    epoch: int = 0
    offset: int = 0

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class Batch:
    """A padded micro-batch (right padding); `aux`/`final` in the requested dtype."""

    input_ids: torch.Tensor  # int64 (B, T)
    loss_mask: torch.Tensor  # int64 (B, T)
    attention_mask: torch.Tensor  # int64 (B, T)
    aux: torch.Tensor  # (B, T, 3H)
    final: torch.Tensor  # (B, T, H)
    samples: int
    tokens: int  # real (unpadded) tokens

    def pin(self) -> Batch:
        """Page-locked copies, so the copy to the GPU can overlap compute."""
        pinned = {
            k: getattr(self, k).pin_memory()
            for k in ("input_ids", "loss_mask", "attention_mask", "aux", "final")
        }
        return Batch(**pinned, samples=self.samples, tokens=self.tokens)

    def to(self, device: torch.device) -> Batch:
        moved = {
            k: getattr(self, k).to(device, non_blocking=True)
            for k in ("input_ids", "loss_mask", "attention_mask", "aux", "final")
        }
        return Batch(**moved, samples=self.samples, tokens=self.tokens)


class TrainData:
    """The shards of one hidden-state artifact, split and planned for training."""

    def __init__(
        self,
        hidden_dir: str | Path,
        shard_names: list[str],
        *,
        val_fraction: float,
        seed: int,
        batch_tokens: int,
    ) -> None:
        self.readers = [ShardReader(Path(hidden_dir), name) for name in shard_names]
        self.seed = seed
        self.batch_tokens = batch_tokens
        self.lengths: dict[tuple[int, int], int] = {}
        ids: dict[tuple[int, int], str] = {}
        for s, reader in enumerate(self.readers):
            for i, row in enumerate(reader.manifest["samples"]):
                self.lengths[(s, i)] = int(row[1])
                ids[(s, i)] = row[0]
        held = held_out_ids(ids.values(), val_fraction)
        self.val_items = sorted((item for item, sid in ids.items() if sid in held), key=lambda x: ids[x])
        self.train_items = {item for item, sid in ids.items() if sid not in held}
        if not self.train_items:
            raise TrainDataError(f"{hidden_dir}: no training sample left after holding out {val_fraction:g}")
        self.train_tokens = sum(self.lengths[i] for i in self.train_items)
        self._plans: dict[int, list] = {}

    def shard_order(self, epoch: int) -> list[int]:
        return (
            np.random.default_rng(derived_seed(self.seed, epoch, "shards"))
            .permutation(len(self.readers))
            .tolist()
        )

    def epoch_batches(self, epoch: int) -> list[list[tuple[int, int]]]:
        """Epoch `epoch`'s micro-batches, each a list of (shard, sample index)."""
        if epoch not in self._plans:
            self._plans = {epoch: self._plan(epoch)}  # only the current epoch is kept
        return self._plans[epoch]

    def _plan(self, epoch: int) -> list[list[tuple[int, int]]]:
        stream = []
        for s in self.shard_order(epoch):
            order = self.readers[s].order(derived_seed(self.seed, epoch, "shard", s))
            stream += [(s, i) for i in order if (s, i) in self.train_items]
        rng = np.random.default_rng(derived_seed(self.seed, epoch, "batches"))
        batches: list[list[tuple[int, int]]] = []
        for window in sort_windows(stream, self.lengths, self.batch_tokens):
            window = sorted(window, key=lambda item: -self.lengths[item])
            packed = pack(window, self.lengths, self.batch_tokens)
            batches += [packed[k] for k in rng.permutation(len(packed))]
        return batches

    def take(self, position: Position, count: int) -> tuple[list[list[tuple[int, int]]], Position]:
        """The next `count` micro-batches from `position` (into later epochs as needed)."""
        epoch, offset = position.epoch, position.offset
        taken = []
        while len(taken) < count:
            plan = self.epoch_batches(epoch)
            if offset >= len(plan):
                epoch, offset = epoch + 1, 0
                continue
            taken.append(plan[offset])
            offset += 1
        return taken, Position(epoch, offset)

    def val_batches(self) -> list[list[tuple[int, int]]]:
        ordered = sorted(self.val_items, key=lambda item: -self.lengths[item])
        return pack(ordered, self.lengths, self.batch_tokens)

    def collate(self, items: list[tuple[int, int]], dtype: torch.dtype | None = None) -> Batch:
        """Read and right-pad the samples of one micro-batch (`dtype` None keeps the shard dtype)."""
        samples = [self.readers[s][i] for s, i in items]
        width = max(len(x.input_ids) for x in samples)
        rows = len(samples)
        hidden = samples[0].final.shape[-1]
        dtype = dtype or samples[0].aux.dtype
        input_ids = torch.zeros(rows, width, dtype=torch.long)
        loss_mask = torch.zeros(rows, width, dtype=torch.long)
        attention = torch.zeros(rows, width, dtype=torch.long)
        aux = torch.zeros(rows, width, 3 * hidden, dtype=dtype)
        final = torch.zeros(rows, width, hidden, dtype=dtype)
        for r, x in enumerate(samples):
            n = len(x.input_ids)
            input_ids[r, :n] = x.input_ids
            loss_mask[r, :n] = x.loss_mask.to(torch.long)
            attention[r, :n] = 1
            aux[r, :n] = x.aux
            final[r, :n] = x.final
        return Batch(input_ids, loss_mask, attention, aux, final, rows, int(attention.sum()))
