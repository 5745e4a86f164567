"""Snakemake entry point for rule `train_segment` (logic: draftsmith.train.stage.train_segment)."""

from draftsmith.runtime.jobs import from_snakemake
from draftsmith.train.stage import train_segment

from_snakemake(snakemake, train_segment)  # noqa: F821 (injected by Snakemake)
