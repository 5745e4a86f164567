"""Snakemake entry point for rule `train` (logic: draftsmith.train.stage.train)."""

from draftsmith.runtime.jobs import from_snakemake
from draftsmith.train.stage import train

from_snakemake(snakemake, train)  # noqa: F821 (injected by Snakemake)
