"""EAGLE-3 draft training: one segment of steps per call, resumable exactly.

A run is split into segments of `checkpoint_every` steps (the last may be shorter);
`run_segment` trains one, starting fresh from the seed (segment 0) or from the
previous segment's checkpoint, validates on the held-out slice, and writes

- the checkpoint: the whole training state, written atomically (`train.state`:
  continuing from it gives bitwise the same steps as never having stopped);
- the metrics: one JSON line per step (loss and accuracy per TTT position, lr,
  grad norm, tokens/s) and one validation line.

Targets: the embedding (frozen) and the lm_head (the embedding when
`tie_word_embeddings`) are read from the target's safetensors, never the whole
model. The draft's lm_head starts as the target's rows of the draft vocabulary
and its final norm as the target's.

Batches and the loss: an optimiser step takes `grad_accum` micro-batches (each at
most `batch_tokens` padded tokens, see `draft.data`). Each TTT step's loss is its
summed cross-entropy over the whole global batch divided by that step's valid
count over the whole global batch, so the result does not depend on how the
micro-batches are spread over processes: a first pass counts valid positions
(all-reduced), the second runs forward and backward.

Data parallel: with world size W (`train.gpus`; the processes and their group are
`train.launch`'s and `train.process_group`'s) rank r takes micro-batches r, r+W, ...
of each step; gradients are summed with all_reduce; every rank then takes the same
clipped AdamW step. Rank 0 writes checkpoints and metrics. The result equals one
process with the same global batch up to float summation order.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import torch

from draftsmith.draft.model import (
    STEP_DECAY,
    DraftConfig,
    Eagle3Draft,
    target_in_vocab,
    ttt_sums,
    valid_positions,
)
from draftsmith.fsutil import atomic
from draftsmith.runtime import jobs
from draftsmith.target.dtypes import torch_dtype
from draftsmith.target.load import load_target
from draftsmith.train.data import Batch, Position, TrainData
from draftsmith.train.process_group import Dist
from draftsmith.train.settings import LoopSettings, TrainSpec
from draftsmith.train.state import TrainError, TrainState, seed_everything

log = logging.getLogger(__name__)


class WarmupCosine:
    """LR factor: linear warmup over `warmup` steps, then cosine decay to 0 at `total`."""

    def __init__(self, warmup: int, total: int) -> None:
        self.warmup = warmup
        self.total = total

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return (step + 1) / self.warmup
        span = max(self.total - self.warmup, 1)
        progress = min((step - self.warmup) / span, 1.0)
        return 0.5 * (1.0 + math.cos(math.pi * progress))


# --- the loop ----------------------------------------------------------------------
def figures(values: torch.Tensor, steps: int) -> dict:
    """Loss/accuracy per TTT position from [loss sums, correct, counts] (each `steps` long)."""
    sums, correct, counts = (
        values[:steps].tolist(),
        values[steps : 2 * steps].tolist(),
        values[2 * steps : 3 * steps].tolist(),
    )
    loss_pos = [s / c if c else 0.0 for s, c in zip(sums, counts, strict=True)]
    return {
        "loss": sum(STEP_DECAY**j * x for j, x in enumerate(loss_pos)),
        "loss_pos": loss_pos,
        "acc_pos": [k / c if c else 0.0 for k, c in zip(correct, counts, strict=True)],
        "count_pos": [int(c) for c in counts],
    }


class Trainer(TrainState):
    """Draft, optimiser, scheduler and data for one training process."""

    def __init__(self, spec: TrainSpec, dist: Dist | None = None) -> None:
        self.spec = spec
        self.dist = dist or Dist()
        t = self.train = spec.train
        self.steps = t.ttt_steps
        self.autocast_dtype = torch_dtype(t.dtype) if t.dtype else None
        if t.device == "cuda":
            if not torch.cuda.is_available():
                raise TrainError("train.device is cuda but no GPU is visible")
            self.device = torch.device("cuda", self.dist.local_rank)
            torch.cuda.set_device(self.device)
        else:
            self.device = torch.device("cpu")
        seed_everything(t.seed)
        text_config, weights = load_target(spec.hf_dir, spec.trust_remote_code)
        self.config = DraftConfig.from_target(text_config, t.draft_vocab_size, t.max_position_embeddings)
        compute = self.autocast_dtype or torch.float32
        self.draft = Eagle3Draft(self.config, weights["embed"].to(compute))
        vocab = _load_vocab(spec.vocab, self.config)
        self.draft.set_vocab(vocab["d2t"], vocab["t2d"])
        with torch.no_grad():
            draft_ids = vocab["d2t"] + torch.arange(self.config.draft_vocab_size)
            self.draft.lm_head.weight.copy_(weights["head"][draft_ids].float())
            if "norm" in weights:
                self.draft.norm.weight.copy_(weights["norm"].float())
        self.draft.to(self.device)
        self.head = weights["head"].to(self.device, compute)
        del weights
        self.params = [p for p in self.draft.parameters() if p.requires_grad]
        for p in self.params:  # identical start on every rank, whatever their RNG did
            self.dist.broadcast(p.data)
        self.optimizer = torch.optim.AdamW(self.params, lr=t.lr, betas=t.betas, weight_decay=t.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, WarmupCosine(t.warmup_steps, t.total_steps)
        )
        self.data = TrainData(
            spec.hidden_dir,
            spec.assignment,
            val_fraction=t.val_fraction,
            seed=t.seed,
            batch_tokens=t.batch_tokens,
        )
        # Without autocast the draft runs in float32 whatever the shard dtype.
        self.input_dtype = None if self.autocast_dtype else torch.float32
        self.position = Position()
        self.step = 0
        self.totals = {"tokens": 0, "samples": 0, "wall_s": 0.0}
        # Per sample: is the target's argmax in the draft vocabulary (a fixed function of the
        # data, computed once per process: the full-vocabulary product is the costliest part
        # of a CPU step). Computed per sample, never per batch, so it cannot depend on what
        # the sample was batched with.
        self._in_vocab: dict[int, torch.Tensor] = {}
        # One loader thread reads and pads the next step's micro-batches while the device
        # works on this one. All shard reads go through it (a reader is not thread-safe).
        self._loader = ThreadPoolExecutor(1, thread_name_prefix="draft-loader")
        self._upcoming: tuple[Position, Future] | None = None
        # Synchronise the device between phases to time them (benchmarks; costs a little).
        self.profile = False

    # -- steps
    def _autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def in_vocab(self, items: list[int], batch: Batch) -> torch.Tensor:
        """(B, T) bool on the device: the target's argmax is in the draft vocabulary."""
        rows = torch.zeros(batch.input_ids.shape, dtype=torch.bool)
        for r, item in enumerate(items):
            n = self.data.lengths[item]
            if item not in self._in_vocab:
                final = batch.final[r, :n]
                self._in_vocab[item] = target_in_vocab(self.draft, self.head, final).cpu()
            rows[r, :n] = self._in_vocab[item]
        return rows.to(self.device)

    def _sums(self, batch: Batch, in_vocab: torch.Tensor) -> list[dict]:
        with self._autocast():
            return ttt_sums(
                self.draft,
                self.head,
                batch.input_ids,
                batch.loss_mask,
                batch.attention_mask,
                batch.aux,
                batch.final,
                self.steps,
                in_vocab=in_vocab,
            )

    def _load(self, position: Position) -> tuple[list[Batch], list[list[int]], Position]:
        """This rank's micro-batches of the step at `position`, read, padded (and pinned)."""
        plans, next_position = self.data.take(position, self.train.grad_accum)
        mine = plans[self.dist.rank :: self.dist.world]
        batches = [self.data.collate(items, self.input_dtype) for items in mine]
        if self.device.type == "cuda":
            batches = [batch.pin() for batch in batches]
        return batches, mine, next_position

    def _next_step_data(self):
        """The current step's data (prefetched when possible), then start the next step's."""
        upcoming, self._upcoming = self._upcoming, None
        if upcoming is not None and upcoming[0] == self.position:
            loaded = upcoming[1].result()
        else:
            loaded = self._loader.submit(self._load, self.position).result()
        next_position = loaded[2]
        self._upcoming = (next_position, self._loader.submit(self._load, next_position))
        return loaded

    def _mark(self, timings: dict, phase: str, since: float) -> float:
        if self.profile and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        now = time.perf_counter()
        timings[phase] = timings.get(phase, 0.0) + now - since
        return now

    def train_step(self) -> dict:
        """One optimiser step over the next global batch; returns its metrics record."""
        started = time.perf_counter()
        timings: dict[str, float] = {}
        k = self.steps
        loaded, mine, next_position = self._next_step_data()
        mark = self._mark(timings, "data_wait_s", started)
        prepared = []
        counts = torch.zeros(k, dtype=torch.float64, device=self.device)
        for items, host_batch in zip(mine, loaded, strict=True):
            batch = host_batch.to(self.device)
            in_vocab = self.in_vocab(items, batch)
            for j in range(k):
                counts[j] += valid_positions(batch.loss_mask, batch.attention_mask, in_vocab, j).sum()
            prepared.append((batch, in_vocab))
        counts = self.dist.all_reduce(counts).tolist()
        weights = [STEP_DECAY**j / max(c, 1.0) for j, c in enumerate(counts)]
        # loss sums, correct, counts (filled in below), tokens, samples
        totals = torch.zeros(3 * k + 2, dtype=torch.float64, device=self.device)
        mark = self._mark(timings, "prepare_s", mark)
        for batch, in_vocab in prepared:
            stats = self._sums(batch, in_vocab)
            loss = sum(w * s["loss_sum"] for w, s in zip(weights, stats, strict=True))
            mark = self._mark(timings, "forward_s", mark)
            loss.backward()
            mark = self._mark(timings, "backward_s", mark)
            for j, s in enumerate(stats):
                totals[j] += s["loss_sum"].detach().double()
                totals[k + j] += s["correct"].double()
            totals[3 * k] += batch.tokens
            totals[3 * k + 1] += batch.samples
        del prepared
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            self.dist.all_reduce(p.grad)
        self.dist.all_reduce(totals)
        totals[2 * k : 3 * k] = torch.tensor(counts, dtype=torch.float64)
        clip = self.train.grad_clip
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, clip if clip is not None else math.inf)
        lr = self.optimizer.param_groups[0]["lr"]
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self._mark(timings, "optimizer_s", mark)
        self.position = next_position
        self.step += 1
        values = totals.cpu()
        tokens, samples = int(values[3 * k]), int(values[3 * k + 1])
        elapsed = time.perf_counter() - started
        self.totals["tokens"] += tokens
        self.totals["samples"] += samples
        self.totals["wall_s"] += elapsed
        return {
            "kind": "train",
            "step": self.step,
            "epoch": self.position.epoch
            + self.position.offset / len(self.data.epoch_batches(self.position.epoch)),
            **figures(values, k),
            "lr": lr,
            "grad_norm": float(grad_norm),
            "tokens": tokens,
            "samples": samples,
            "tok_s": tokens / elapsed if elapsed > 0 else 0.0,
            "time_s": elapsed,
            **({"timings": timings} if self.profile else {"data_wait_s": timings["data_wait_s"]}),
        }

    @torch.no_grad()
    def validate(self) -> dict | None:
        """Loss and accuracy per TTT position on the held-out slice (None when there is none)."""
        plans = self.data.val_batches()
        if not plans:
            return None
        started = time.perf_counter()
        k = self.steps
        totals = torch.zeros(3 * k + 2, dtype=torch.float64, device=self.device)
        for items in plans[self.dist.rank :: self.dist.world]:
            batch = self._loader.submit(self.data.collate, items, self.input_dtype).result().to(self.device)
            for j, s in enumerate(self._sums(batch, self.in_vocab(items, batch))):
                totals[j] += s["loss_sum"].double()
                totals[k + j] += s["correct"].double()
                totals[2 * k + j] += s["count"].double()
            totals[3 * k] += batch.tokens
            totals[3 * k + 1] += batch.samples
        values = self.dist.all_reduce(totals).cpu()
        self.totals["wall_s"] += time.perf_counter() - started
        return {
            "kind": "val",
            "step": self.step,
            **figures(values, k),
            "tokens": int(values[3 * k]),
            "samples": int(values[3 * k + 1]),
        }

    def train_until(self, end: int, on_step=None) -> list[dict]:
        records = []
        while self.step < end:
            record = self.train_step()
            records.append(record)
            if on_step is not None:
                on_step(record)
        return records


def _load_vocab(path: str | Path, config: DraftConfig) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    vocab = load_file(str(path))
    if vocab["d2t"].numel() != config.draft_vocab_size or vocab["t2d"].numel() != config.vocab_size:
        raise TrainError(
            f"{path}: vocabulary of {vocab['d2t'].numel()} over {vocab['t2d'].numel()} ids, the draft "
            f"needs {config.draft_vocab_size} over {config.vocab_size}"
        )
    return vocab


# --- one segment -------------------------------------------------------------------
def segment_bounds(train: LoopSettings, segment: int) -> tuple[int, int]:
    """Steps [start, end) of `segment`."""
    every, total = train.checkpoint_every, train.total_steps
    start = segment * every
    if not 0 <= start < total:
        raise TrainError(f"segment {segment} is outside the run ({total} steps, {every} per segment)")
    return start, min(start + every, total)


def num_segments(train: LoopSettings) -> int:
    return math.ceil(train.total_steps / train.checkpoint_every)


def run_segment(
    spec: TrainSpec,
    segment: int,
    previous: str | Path | None,
    checkpoint: str | Path,
    metrics: str | Path,
    dist: Dist | None = None,
) -> dict:
    """Train `segment` (from `previous`, or fresh for segment 0); rank 0 writes both outputs."""
    dist = dist or Dist()
    start, end = segment_bounds(spec.train, segment)
    trainer = Trainer(spec, dist)
    if segment > 0:
        if previous is None:
            raise TrainError(f"segment {segment} needs the checkpoint of segment {segment - 1}")
        trainer.load(previous)
    if trainer.step != start:
        raise TrainError(f"segment {segment} starts at step {start}, the checkpoint is at {trainer.step}")
    bar = jobs.progress(end - start, f"train segment {segment}", unit="step") if dist.main else None

    def on_step(record: dict) -> None:
        if bar is not None:
            bar.set_postfix_str(
                f"loss {record['loss']:.3f} acc0 {record['acc_pos'][0]:.3f} "
                f"lr {record['lr']:.2e} {record['tok_s']:.0f} tok/s",
                refresh=False,
            )
            bar.update(1)

    records = trainer.train_until(end, on_step)
    if bar is not None:
        bar.close()
    val = trainer.validate()
    if val is not None:
        records.append(val)
        if dist.main:
            log.info(
                "segment %d, step %d: val loss %.4f, acc per position %s",
                segment,
                trainer.step,
                val["loss"],
                " ".join(f"{a:.3f}" for a in val["acc_pos"]),
            )
    if dist.main:
        atomic.write_jsonl(metrics, records)
        trainer.save(checkpoint, segment)
    return {"step": trainer.step, "records": records, "totals": dict(trainer.totals)}
