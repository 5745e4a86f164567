"""The settings the training stage reads (rules `train_segment` and `train`), resolved once
by `workflow.configure`, and the job every training process of a segment runs.

No torch here: the Snakefile builds these while parsing.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from draftsmith.errors import ConfigError
from draftsmith.runtime.resources import train_gpus


@dataclass(frozen=True)
class LoopSettings:
    """The train section as every training process reads it (`train.loop`); a checkpoint
    records it."""

    draft_vocab_size: int
    ttt_steps: int
    max_position_embeddings: int
    lr: float
    betas: tuple[float, float]
    weight_decay: float
    warmup_steps: int
    total_steps: int
    grad_clip: float | None
    grad_accum: int  # micro-batches per step over all processes together
    batch_tokens: int
    checkpoint_every: int
    val_fraction: float
    seed: int
    device: str
    dtype: str | None
    gpus: int  # data-parallel processes

    @classmethod
    def from_json(cls, data: dict) -> LoopSettings:
        """Read `asdict` back from JSON (a rank's job file), which has lists for tuples."""
        return cls(**{**data, "betas": tuple(data["betas"])})


@dataclass(frozen=True)
class TrainSettings:
    """What the segment and final jobs read: the loop's settings and how to read the target."""

    loop: LoopSettings
    trust_remote_code: bool  # model.trust_remote_code, for reading the target's weights
    gpus_held: int  # GPUs one segment job holds (`runtime.resources.train_gpus`)

    @classmethod
    def of(cls, config: dict) -> TrainSettings:
        train = config["train"]
        _check(train, config["tokenize"]["max_length"])
        values = {f.name: train[f.name] for f in fields(LoopSettings)}
        return cls(
            loop=LoopSettings(**{**values, "betas": tuple(train["betas"])}),
            trust_remote_code=config["model"]["trust_remote_code"],
            gpus_held=train_gpus(config),
        )


def _check(train: dict, max_length: int) -> None:
    """Refuse train settings that cannot work together; every problem in one error."""
    problems = []
    if train["grad_accum"] % train["gpus"]:
        problems.append(
            f"train.grad_accum ({train['grad_accum']}) must be a multiple of train.gpus ({train['gpus']}): "
            "each process takes an equal share of every step's micro-batches"
        )
    if train["batch_tokens"] < max_length:
        problems.append(
            f"train.batch_tokens ({train['batch_tokens']}) is below tokenize.max_length ({max_length}): "
            "the longest sample would not fit a micro-batch"
        )
    if train["max_position_embeddings"] < max_length:
        problems.append(
            f"train.max_position_embeddings ({train['max_position_embeddings']}) is below "
            f"tokenize.max_length ({max_length}): the draft must cover the context it is served at"
        )
    if train["warmup_steps"] > train["total_steps"]:
        problems.append(f"train.warmup_steps ({train['warmup_steps']}) exceeds train.total_steps")
    if problems:
        raise ConfigError("; ".join(problems))


@dataclass(frozen=True)
class TrainSpec:
    """What every training process of a segment needs; torchrun and srun ranks read it from
    a JSON file (`train.launch.write_rank_job`)."""

    key: str  # the draft's (the train artifact's) key, which its checkpoints carry
    hf_dir: str
    trust_remote_code: bool
    hidden_dir: str  # the states store
    assignment: str  # the mix's view of it
    vocab: str
    train: LoopSettings

    def as_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> TrainSpec:
        return cls(**{**data, "train": LoopSettings.from_json(data["train"])})
