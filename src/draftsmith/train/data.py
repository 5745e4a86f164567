"""Training data for the draft: the held-out split, the epoch plan and padded micro-batches.

- Split: `formats.merged.held_out_ids` (the one held-out rule).
- Samples: the mix's, in the merged JSONL's order, as the mix's view lists them
  (`assignment.json`: sample id, address, stored shard; `hidden.assign`). Each is read
  from whichever shard of the states store holds its address (shards may hold other
  mixes' samples too), and its bytes are checked against the address when read.
- Epoch plan (`TrainData.epoch_batches`): epoch e visits the mix's training samples
  in a seeded permutation; consecutive windows of that stream are sorted by length
  and packed into micro-batches of at most `batch_tokens` padded tokens (longest x
  count), and each window's micro-batches are shuffled. A window holds at least
  `SORT_WINDOW` samples and at least `WINDOW_BATCHES` micro-batches' worth of
  tokens: with large batches, a fixed sample count would leave them half padding.
  Everything is derived from (seed, epoch) and the view, never from a random state,
  so a data position is just (epoch, offset): the index of the next micro-batch in
  that epoch's plan.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from draftsmith.errors import DraftsmithError
from draftsmith.formats.merged import held_out_ids
from draftsmith.formats.shards.reader import Sample, ShardReader
from draftsmith.store.hashing import sample_address

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


def pack(items: list[int], lengths: list[int], budget: int) -> list[list[int]]:
    """Greedy packing of items (already in order) into batches of at most `budget` padded tokens."""
    batches: list[list[int]] = []
    current: list[int] = []
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


def sort_windows(stream: list[int], lengths: list[int], batch_tokens: int) -> Iterable[list[int]]:
    """Consecutive slices of `stream`, each at least `SORT_WINDOW` samples and
    `WINDOW_BATCHES` batches' worth of tokens (the last may be smaller)."""
    least_tokens = WINDOW_BATCHES * batch_tokens
    window: list[int] = []
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
    """A mix's samples, read from the states store through the mix's view, split and
    planned for training. An item is a sample's position in the mix."""

    def __init__(
        self,
        states_dir: str | Path,
        assignment: str | Path,
        *,
        val_fraction: float,
        seed: int,
        batch_tokens: int,
    ) -> None:
        view = json.loads(Path(assignment).read_text(encoding="utf-8"))
        self.readers = [ShardReader(Path(states_dir), name) for name in view["shards"]]
        reader_of = {name: r for r, name in enumerate(view["shards"])}
        self.seed = seed
        self.batch_tokens = batch_tokens
        self.ids: list[str] = []
        self.addresses: list[str] = []
        self.where: list[tuple[int, int]] = []  # (reader, row) of each item
        self.lengths: list[int] = []
        for sample_id, address, shard in view["samples"]:
            reader = self.readers[reader_of[shard]]
            row = reader.index_of(address)
            self.ids.append(sample_id)
            self.addresses.append(address)
            self.where.append((reader_of[shard], row))
            self.lengths.append(int(reader.manifest["samples"][row][1]))
        held = held_out_ids(self.ids, val_fraction)
        self.val_items = sorted(
            (k for k, sid in enumerate(self.ids) if sid in held), key=lambda k: self.ids[k]
        )
        self.train_items = [k for k, sid in enumerate(self.ids) if sid not in held]
        if not self.train_items:
            raise TrainDataError(f"{assignment}: no training sample left after holding out {val_fraction:g}")
        self.train_tokens = sum(self.lengths[k] for k in self.train_items)
        self._plans: dict[int, list] = {}

    def epoch_order(self, epoch: int) -> list[int]:
        """Epoch `epoch`'s training samples in their seeded order."""
        rng = np.random.default_rng(derived_seed(self.seed, epoch, "samples"))
        return [self.train_items[k] for k in rng.permutation(len(self.train_items))]

    def order_digest(self, epoch: int) -> str:
        """What a checkpoint records of the data: its epoch's order, as the addresses."""
        text = "\n".join(self.addresses[k] for k in self.epoch_order(epoch))
        return hashlib.sha256(text.encode()).hexdigest()

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        """Epoch `epoch`'s micro-batches, each a list of items."""
        if epoch not in self._plans:
            self._plans = {epoch: self._plan(epoch)}  # only the current epoch is kept
        return self._plans[epoch]

    def _plan(self, epoch: int) -> list[list[int]]:
        rng = np.random.default_rng(derived_seed(self.seed, epoch, "batches"))
        batches: list[list[int]] = []
        for window in sort_windows(self.epoch_order(epoch), self.lengths, self.batch_tokens):
            window = sorted(window, key=lambda item: -self.lengths[item])
            packed = pack(window, self.lengths, self.batch_tokens)
            batches += [packed[k] for k in rng.permutation(len(packed))]
        return batches

    def take(self, position: Position, count: int) -> tuple[list[list[int]], Position]:
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

    def val_batches(self) -> list[list[int]]:
        ordered = sorted(self.val_items, key=lambda item: -self.lengths[item])
        return pack(ordered, self.lengths, self.batch_tokens)

    def read(self, item: int) -> Sample:
        """One sample's stored row, refused unless its bytes are the mix's sample."""
        r, row = self.where[item]
        sample = self.readers[r][row]
        if sample_address(sample.input_ids.numpy(), sample.loss_mask.numpy()) != self.addresses[item]:
            raise TrainDataError(
                f"{self.readers[r].bin_path}: row {row} is not sample {self.ids[item]} "
                f"(address {self.addresses[item]}); run draftsmith verify"
            )
        return sample

    def collate(self, items: list[int], dtype: torch.dtype | None = None) -> Batch:
        """Read and right-pad the samples of one micro-batch (`dtype` None keeps the shard dtype)."""
        samples = [self.read(item) for item in items]
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
