"""Snakemake entry point for rule `responses` (logic: draftsmith.stages.generate_responses)."""

from draftsmith.stages import from_snakemake, generate_responses

from_snakemake(snakemake, generate_responses)  # noqa: F821 (injected by Snakemake)
