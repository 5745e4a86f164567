"""EAGLE-3 draft training: one segment of steps per call, resumable exactly.

A run is split into segments of `checkpoint_every` steps (the last may be shorter);
`run_segment` trains one, starting fresh from the seed (segment 0) or from the
previous segment's checkpoint, validates on the held-out slice, and writes

- the checkpoint: draft weights (without the frozen embedding), AdamW state, LR
  scheduler, step, data position (epoch, a digest of that epoch's sample order, offset into
  its micro-batch plan), totals, and every RNG state (python, numpy, torch,
  cuda), written atomically;
- the metrics: one JSON line per step (loss and accuracy per TTT position, lr,
  grad norm, tokens/s) and one validation line.

Continuing from a checkpoint gives bitwise the same steps as never having stopped
(on CPU, same thread count): nothing the loop reads is left out of the state.

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

Data parallel: with world size W (`train.gpus`; torchrun, or srun tasks inside a
Slurm allocation; NCCL on GPU, gloo on CPU) rank r takes micro-batches r, r+W, ...
of each step; gradients are summed with all_reduce; every rank then takes the same
clipped AdamW step. Rank 0 writes checkpoints and metrics. The result equals one
process with the same global batch up to float summation order.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import random
import shlex
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from draftsmith.draft.model import (
    STEP_DECAY,
    DraftConfig,
    Eagle3Draft,
    target_in_vocab,
    ttt_sums,
    valid_positions,
)
from draftsmith.errors import DraftsmithError
from draftsmith.runtime import jobs, slurm
from draftsmith.store import atomic
from draftsmith.target.dtypes import torch_dtype
from draftsmith.target.load import load_target
from draftsmith.train.data import Batch, Position, TrainData

log = logging.getLogger(__name__)

CHECKPOINT_FORMAT = 2
_EMBED = "embed_tokens.weight"


class TrainError(DraftsmithError):
    pass


# --- processes ---------------------------------------------------------------------
@dataclass
class Dist:
    """This process's place in a data-parallel group (world 1: no group)."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @classmethod
    def from_env(cls) -> Dist:
        return cls(
            int(os.environ.get("RANK", 0)),
            int(os.environ.get("WORLD_SIZE", 1)),
            int(os.environ.get("LOCAL_RANK", 0)),
        )

    @property
    def main(self) -> bool:
        return self.rank == 0

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.world > 1:
            import torch.distributed as dist

            dist.all_reduce(tensor)
        return tensor

    def broadcast(self, tensor: torch.Tensor) -> None:
        if self.world > 1:
            import torch.distributed as dist

            dist.broadcast(tensor, 0)


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


class Trainer:
    """Draft, optimiser, scheduler and data for one training process."""

    def __init__(self, spec: dict, dist: Dist | None = None) -> None:
        self.spec = spec
        self.dist = dist or Dist()
        t = self.train = spec["train"]
        self.steps = t["ttt_steps"]
        self.autocast_dtype = torch_dtype(t["dtype"]) if t["dtype"] else None
        if t["device"] == "cuda":
            if not torch.cuda.is_available():
                raise TrainError("train.device is cuda but no GPU is visible")
            self.device = torch.device("cuda", self.dist.local_rank)
            torch.cuda.set_device(self.device)
        else:
            self.device = torch.device("cpu")
        seed_everything(t["seed"])
        text_config, weights = load_target(spec["hf_dir"], spec.get("trust_remote_code", False))
        self.config = DraftConfig.from_target(
            text_config, t["draft_vocab_size"], t["max_position_embeddings"]
        )
        compute = self.autocast_dtype or torch.float32
        self.draft = Eagle3Draft(self.config, weights["embed"].to(compute))
        vocab = _load_vocab(spec["vocab"], self.config)
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
        self.optimizer = torch.optim.AdamW(
            self.params, lr=t["lr"], betas=tuple(t["betas"]), weight_decay=t["weight_decay"]
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, WarmupCosine(t["warmup_steps"], t["total_steps"])
        )
        self.data = TrainData(
            spec["hidden_dir"],
            spec["assignment"],
            val_fraction=t["val_fraction"],
            seed=t["seed"],
            batch_tokens=t["batch_tokens"],
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

    # -- state
    def state_dict(self, segment: int) -> dict:
        return {
            "format": CHECKPOINT_FORMAT,
            "key": self.spec["key"],
            "segment": segment,
            "step": self.step,
            "model": {k: v.detach().cpu() for k, v in self.draft.state_dict().items() if k != _EMBED},
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "data": {**self.position.as_dict(), "order": self.data.order_digest(self.position.epoch)},
            "totals": dict(self.totals),
            "rng": rng_state(),
            "draft_config": self.config.as_dict(),
            "train": dict(self.train),
        }

    def save(self, path: str | Path, segment: int) -> None:
        state = self.state_dict(segment)
        with atomic.atomic_open(path, "wb") as handle:
            torch.save(state, handle)

    def load(self, path: str | Path) -> dict:
        state = torch.load(path, map_location="cpu", weights_only=True)
        if state.get("format") != CHECKPOINT_FORMAT:
            raise TrainError(f"{path}: checkpoint format {state.get('format')}, expected {CHECKPOINT_FORMAT}")
        if state["key"] != self.spec["key"]:
            raise TrainError(f"{path}: checkpoint of draft {state['key']}, this run is {self.spec['key']}")
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
        plans, next_position = self.data.take(position, self.train["grad_accum"])
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
        clip = self.train["grad_clip"]
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
def segment_bounds(train: dict, segment: int) -> tuple[int, int]:
    """Steps [start, end) of `segment`."""
    every, total = train["checkpoint_every"], train["total_steps"]
    start = segment * every
    if not 0 <= start < total:
        raise TrainError(f"segment {segment} is outside the run ({total} steps, {every} per segment)")
    return start, min(start + every, total)


def num_segments(train: dict) -> int:
    return math.ceil(train["total_steps"] / train["checkpoint_every"])


def run_segment(
    spec: dict,
    segment: int,
    previous: str | Path | None,
    checkpoint: str | Path,
    metrics: str | Path,
    dist: Dist | None = None,
) -> dict:
    """Train `segment` (from `previous`, or fresh for segment 0); rank 0 writes both outputs."""
    dist = dist or Dist()
    start, end = segment_bounds(spec["train"], segment)
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


# --- processes: in this one, a torchrun group, or srun tasks ------------------------
def write_rank_job(
    spec: dict, segment: int, previous: str | Path | None, checkpoint: str | Path, metrics: str | Path
) -> Path:
    """The file each rank of a group reads its segment from (a temp beside the checkpoint,
    which the launcher removes)."""
    job = {
        "spec": spec,
        "segment": segment,
        "previous": str(previous) if previous else None,
        "checkpoint": str(checkpoint),
        "metrics": str(metrics),
    }
    job_file = Path(checkpoint).parent / atomic.temp_name(f"segment-{segment:05d}.json")
    atomic.write_json(job_file, job)
    return job_file


def launch(
    spec: dict,
    segment: int,
    previous: str | Path | None,
    checkpoint: str | Path,
    metrics: str | Path,
    *,
    world_size: int,
    threads: int = 1,
    torchrun: bool | None = None,
) -> None:
    """Run one segment in this process (world size 1) or in a group of `world_size`
    processes: srun tasks inside a Slurm allocation (`runtime.slurm`), else torchrun
    (`torchrun` True forces a torchrun group of one, as on a node with one GPU)."""
    if not (world_size > 1 if torchrun is None else torchrun):
        run_segment(spec, segment, previous, checkpoint, metrics)
        return
    from draftsmith.runtime.process import run_guarded

    job_file = write_rank_job(spec, segment, previous, checkpoint, metrics)
    rank_threads = max(1, threads // world_size)
    env = {"OMP_NUM_THREADS": str(rank_threads), "PYTHONUNBUFFERED": "1"}
    rank = [sys.executable, "-m", "draftsmith.train.loop", str(job_file)]
    launcher = "srun" if slurm.in_allocation() and torchrun is None else "torchrun"
    if launcher == "srun":
        cuda = spec["train"]["device"] == "cuda"
        cmd = slurm.srun_command(world_size, rank_threads, int(cuda), [*rank, "--slurm"])
        env |= slurm.rendezvous_env()
    else:
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nnodes",
            "1",
            "--nproc-per-node",
            str(world_size),
            *rank[1:],
        ]
    try:
        code = run_guarded(cmd, env=env, name=f"{launcher} segment {segment}")
    finally:
        job_file.unlink(missing_ok=True)
    if code != 0:
        raise TrainError(f"{launcher} for segment {segment} exited with code {code}: {shlex.join(cmd)}")


def process_group_backend(device: str) -> str:
    """NCCL between GPUs (gloo would copy every all-reduce through host memory), gloo on CPU."""
    return "nccl" if device == "cuda" else "gloo"


def main(argv: list[str] | None = None) -> int:
    """Entry point of one rank: `python -m draftsmith.train.loop JOB.json [--slurm]` (a
    torchrun process, or with `--slurm` an srun task)."""
    parser = argparse.ArgumentParser(prog="python -m draftsmith.train.loop")
    parser.add_argument("job", type=Path)
    parser.add_argument("--slurm", action="store_true", help="take the rank from srun's task variables")
    args = parser.parse_args(argv)
    job = json.loads(args.job.read_text())
    if args.slurm:
        os.environ.update(slurm.rank_env(dict(os.environ)))
    dist_env = Dist.from_env()
    logging.basicConfig(
        level=logging.INFO if dist_env.main else logging.WARNING,
        format=f"%(asctime)s %(levelname)s rank{dist_env.rank} %(name)s: %(message)s",
        stream=sys.stderr,
    )
    jobs.set_parent_death_signal()
    import torch.distributed as dist

    device = job["spec"]["train"]["device"]
    if device == "cuda":
        # torchrun shows a rank every GPU; srun with --gpus-per-task shows it its own.
        torch.cuda.set_device(dist_env.local_rank % torch.cuda.device_count())
    dist.init_process_group(process_group_backend(device))
    try:
        run_segment(job["spec"], job["segment"], job["previous"], job["checkpoint"], job["metrics"], dist_env)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
