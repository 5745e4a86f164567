"""Snakemake entry point for rule `merge` (logic: draftsmith.stages.merge_datasets)."""

from draftsmith.stages import from_snakemake, merge_datasets

from_snakemake(snakemake, merge_datasets)  # noqa: F821 (injected by Snakemake)
