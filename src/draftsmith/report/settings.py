"""The settings the report stage reads, resolved once by `workflow.configure`.

No torch here: the Snakefile builds these while parsing.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ReportSettings:
    """What the report job reads of the config: the experiment its pages are titled by. What
    it reports on (evaluation, search, serving benchmark) it learns from its inputs."""

    experiment: str

    @classmethod
    def of(cls, config: dict) -> ReportSettings:
        return cls(experiment=config["experiment"])
