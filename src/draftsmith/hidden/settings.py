"""The settings the hidden-state stage reads (rules `hidden_assign`, `hidden_estimate`,
`hidden_shard`), resolved once by `workflow.configure`.

No torch here: the Snakefile builds these while parsing.
"""

from __future__ import annotations

from dataclasses import dataclass

from draftsmith.hidden.sglang_launch import capture_server
from draftsmith.runtime.resources import hidden_gpus
from draftsmith.runtime.sglang import ServerLaunch
from draftsmith.target.layers import AuxLayers, LayerIdError


@dataclass(frozen=True)
class AuxLayerChoice:
    """`extract.aux_layers` as configured: ids in one of `target.layers.CONVENTIONS`."""

    convention: str
    ids: tuple[int, ...]


@dataclass(frozen=True)
class HiddenSettings:
    """What the assign, estimate and shard jobs read of `extract` (and its fallbacks)."""

    experiment: str  # names the estimate's report
    num_shards: int
    backend: str
    device: str
    dtype: str  # extract.dtype, else model.dtype
    storage: str
    zstd_level: int
    zstd_threads: int
    batch_tokens: int
    writer_queue: int
    throughput_tok_s: float | None
    allow_disk_overcommit: bool
    aux_layers: AuxLayerChoice | None  # None: EAGLE-3's default for the target
    trust_remote_code: bool  # model.trust_remote_code, for loading the target (hf backend)
    gpus: int  # GPUs one shard job holds (`runtime.resources.hidden_gpus`)
    sglang: ServerLaunch | None  # the sglang backend's launch; None for hf

    @classmethod
    def of(cls, config: dict) -> HiddenSettings:
        extract = config["extract"]
        choice = extract["aux_layers"]
        sglang = capture_server(extract["sglang"]) if extract["backend"] == "sglang" else None
        return cls(
            experiment=config["experiment"],
            num_shards=extract["num_shards"],
            backend=extract["backend"],
            device=extract["device"],
            dtype=extract["dtype"] or config["model"]["dtype"],
            storage=extract["storage"],
            zstd_level=extract["zstd_level"],
            zstd_threads=extract["zstd_threads"],
            batch_tokens=extract["batch_tokens"],
            writer_queue=extract["writer_queue"],
            throughput_tok_s=extract["throughput_tok_s"],
            allow_disk_overcommit=extract["allow_disk_overcommit"],
            aux_layers=None if choice is None else AuxLayerChoice(choice["convention"], tuple(choice["ids"])),
            trust_remote_code=config["model"]["trust_remote_code"],
            gpus=hidden_gpus(config),
            sglang=sglang,
        )

    def aux(self, num_layers: int) -> AuxLayers:
        """The aux layers of a target with `num_layers` decoder layers: checked in the job,
        which alone knows the target."""
        if self.aux_layers is None:
            return AuxLayers.default(num_layers)
        try:
            return AuxLayers.from_convention(self.aux_layers.convention, self.aux_layers.ids, num_layers)
        except LayerIdError as exc:
            raise LayerIdError(f"extract.aux_layers: {exc}") from None
