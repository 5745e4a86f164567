"""Snakemake entry point for rule `export` (logic: draftsmith.stages.export_draft)."""

from draftsmith.stages import export_draft, from_snakemake

from_snakemake(snakemake, export_draft)  # noqa: F821 (injected by Snakemake)
