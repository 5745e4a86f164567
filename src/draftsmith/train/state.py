"""The training state a checkpoint holds: saved atomically, restored exactly.

A checkpoint (`TrainState.save`) holds the draft weights (without the frozen
embedding), AdamW state, LR scheduler, step, data position (epoch, a digest of that
epoch's sample order, offset into its micro-batch plan), totals, and every RNG state
(python, numpy, torch, cuda). Continuing from one gives bitwise the same steps as never
having stopped (on CPU, same thread count): nothing the loop reads is left out of the
state. `TrainState.load` refuses a checkpoint of another format, draft, draft config or
sample order.
"""

from __future__ import annotations

import random
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from draftsmith.draft.model import DraftConfig, Eagle3Draft
from draftsmith.errors import DraftsmithError
from draftsmith.fsutil import atomic
from draftsmith.train.data import Position, TrainData
from draftsmith.train.settings import LoopSettings, TrainSpec

CHECKPOINT_FORMAT = 2
_EMBED = "embed_tokens.weight"


class TrainError(DraftsmithError):
    pass


# --- RNG state ---------------------------------------------------------------------
def rng_state() -> dict:
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": [name, keys.tolist(), pos, has_gauss, cached],
        "torch": torch.get_rng_state(),
        # Only where CUDA is in use: asking would start it in a CPU job on a GPU host.
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else [],
    }


def set_rng_state(state: dict) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


class TrainState:
    """What a checkpoint holds of a `loop.Trainer`, which sets these attributes."""

    spec: TrainSpec
    train: LoopSettings
    config: DraftConfig
    draft: Eagle3Draft
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    data: TrainData
    position: Position
    step: int
    totals: dict

    def state_dict(self, segment: int) -> dict:
        return {
            "format": CHECKPOINT_FORMAT,
            "key": self.spec.key,
            "segment": segment,
            "step": self.step,
            "model": {k: v.detach().cpu() for k, v in self.draft.state_dict().items() if k != _EMBED},
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "data": {**self.position.as_dict(), "order": self.data.order_digest(self.position.epoch)},
            "totals": dict(self.totals),
            "rng": rng_state(),
            "draft_config": self.config.as_dict(),
            "train": asdict(self.train),
        }

    def save(self, path: str | Path, segment: int) -> None:
        state = self.state_dict(segment)
        with atomic.atomic_open(path, "wb") as handle:
            torch.save(state, handle)

    def load(self, path: str | Path) -> dict:
        state = torch.load(path, map_location="cpu", weights_only=True)
        if state.get("format") != CHECKPOINT_FORMAT:
            raise TrainError(f"{path}: checkpoint format {state.get('format')}, expected {CHECKPOINT_FORMAT}")
        if state["key"] != self.spec.key:
            raise TrainError(f"{path}: checkpoint of draft {state['key']}, this run is {self.spec.key}")
        # A checkpoint from code that built the draft otherwise (say, plain RoPE for a target
        # with scaled RoPE) must not continue as this draft.
        if state["draft_config"] != self.config.as_dict():
            raise TrainError(
                f"{path}: the checkpoint's draft config {state['draft_config']} is not this run's "
                f"{self.config.as_dict()}; train from segment 0"
            )
        missing, unexpected = self.draft.load_state_dict(state["model"], strict=False)
        if missing != [_EMBED] or unexpected:
            raise TrainError(
                f"{path}: weights do not fit the draft (missing {missing}, unexpected {unexpected})"
            )
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        data = state["data"]
        self.position = Position(data["epoch"], data["offset"])
        if self.data.order_digest(self.position.epoch) != data["order"]:
            raise TrainError(f"{path}: the data's sample order differs from the checkpoint's")
        self.step = state["step"]
        self.totals = dict(state["totals"])
        set_rng_state(state["rng"])
        return state
