"""Snakemake entry point for rule `draft` (logic: draftsmith.stages.finish_draft)."""

from draftsmith.stages import finish_draft, from_snakemake

from_snakemake(snakemake, finish_draft)  # noqa: F821 (injected by Snakemake)
