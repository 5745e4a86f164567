"""Snakemake entry point for rule `tokens` (logic: draftsmith.stages.tokenize_dataset)."""

from draftsmith.stages import from_snakemake, tokenize_dataset

from_snakemake(snakemake, tokenize_dataset)  # noqa: F821 (injected by Snakemake)
