"""Snakemake entry point for rule `train_segment` (logic: draftsmith.stages.train_segment)."""

from draftsmith.stages import from_snakemake, train_segment

from_snakemake(snakemake, train_segment)  # noqa: F821 (injected by Snakemake)
