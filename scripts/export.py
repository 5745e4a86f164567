"""Snakemake entry point for rule `export` (logic: draftsmith.export.stage.export)."""

from draftsmith.export.stage import export
from draftsmith.runtime.jobs import from_snakemake

from_snakemake(snakemake, export)  # noqa: F821 (injected by Snakemake)
