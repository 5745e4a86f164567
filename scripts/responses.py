"""Snakemake entry point for rule `responses` (logic: draftsmith.stages.generate_responses)."""

from draftsmith.stages import generate_responses, from_snakemake

from_snakemake(snakemake, generate_responses)  # noqa: F821 (injected by Snakemake)
