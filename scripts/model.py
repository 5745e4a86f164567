"""Snakemake entry point for rule `model` (logic: draftsmith.stages.build_model)."""

from draftsmith.stages import build_model, from_snakemake

from_snakemake(snakemake, build_model)  # noqa: F821 (injected by Snakemake)
