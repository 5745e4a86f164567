"""The settings the tokens stage reads, per dataset, resolved once by `workflow.configure`.

No torch here: the Snakefile builds these while parsing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from draftsmith import config as cfg


@dataclass(frozen=True)
class TokensSettings:
    """What one dataset's tokens job reads: `tokenize`, and the dataset's supervised floor."""

    max_length: int
    max_roundtrip_mismatch: float
    min_supervised_share: float  # the dataset's, else dataset_defaults'
    trust_remote_code: bool  # model.trust_remote_code, for the target's tokenizer

    @classmethod
    def of(cls, config: dict, dataset: str) -> TokensSettings:
        tokenize = config["tokenize"]
        return cls(
            max_length=tokenize["max_length"],
            max_roundtrip_mismatch=tokenize["max_roundtrip_mismatch"],
            min_supervised_share=cfg.dataset_settings(config, dataset)["min_supervised_share"],
            trust_remote_code=config["model"]["trust_remote_code"],
        )

    @classmethod
    def per_dataset(cls, config: dict) -> Mapping[str, TokensSettings]:
        """Each generated (enabled) dataset's settings, by name; read-only."""
        return MappingProxyType({name: cls.of(config, name) for name in cfg.enabled_datasets(config)})
