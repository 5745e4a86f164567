"""The settings the vocab stage reads, resolved once by `workflow.configure`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class VocabSettings:
    """How many target tokens the draft predicts, and which samples are held out."""

    draft_vocab_size: int
    val_fraction: float  # the training split's held-out share: its samples do not count

    @classmethod
    def of(cls, config: dict) -> VocabSettings:
        train = config["train"]
        return cls(draft_vocab_size=train["draft_vocab_size"], val_fraction=train["val_fraction"])
