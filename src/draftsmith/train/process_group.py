"""This process's place in a data-parallel group, and the group's backend.

With world size W (`train.gpus`) each process has a rank r (torchrun's RANK,
WORLD_SIZE and LOCAL_RANK; srun tasks map Slurm's onto them, `runtime.slurm`); the
loop sums over the group with `Dist.all_reduce` and starts every rank from rank 0's
weights with `Dist.broadcast`. World 1 is no group: both are no-ops.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch


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


def process_group_backend(device: str) -> str:
    """NCCL between GPUs (gloo would copy every all-reduce through host memory), gloo on CPU."""
    return "nccl" if device == "cuda" else "gloo"
