"""Snakemake entry point for rule `train` (logic: draftsmith.stages.finish_training)."""

from draftsmith.stages import finish_training, from_snakemake

from_snakemake(snakemake, finish_training)  # noqa: F821 (injected by Snakemake)
