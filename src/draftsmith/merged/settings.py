"""The settings the merged stage reads, resolved once by `workflow.configure`.

No torch here: the Snakefile builds these while parsing.
"""

from __future__ import annotations

from dataclasses import dataclass

from draftsmith import config as cfg
from draftsmith.errors import ConfigError


@dataclass(frozen=True)
class MergedSettings:
    """Which datasets merge, how many samples each gives at most, and the shuffle's seed."""

    experiment: str  # names the data report
    datasets: tuple[str, ...]  # enabled and not excluded, sorted: the rule's inputs, in order
    caps: tuple[tuple[str, int], ...]  # merge.caps of the merged datasets, sorted by name
    seed: int
    excluded: tuple[str, ...]  # merge.exclude, as configured
    max_length: int  # tokenize.max_length, for the data report

    @classmethod
    def of(cls, config: dict) -> MergedSettings:
        """Refuses exclusions and caps naming no dataset, and a merge left with none."""
        merge, names = config["merge"], sorted(config["datasets"])
        for field, listed in (("merge.exclude", merge["exclude"]), ("merge.caps", merge["caps"])):
            unknown = sorted(set(listed) - set(names))
            if unknown:
                raise ConfigError(f"{field}: unknown dataset(s) {unknown} (known: {names})")
        datasets = tuple(cfg.enabled_datasets(config, merged_only=True))
        if not datasets:
            raise ConfigError("no dataset is both enabled and not excluded from the merge")
        return cls(
            experiment=config["experiment"],
            datasets=datasets,
            caps=tuple((n, c) for n, c in sorted(merge["caps"].items()) if n in datasets),
            seed=merge["seed"],
            excluded=tuple(merge["exclude"]),
            max_length=config["tokenize"]["max_length"],
        )
