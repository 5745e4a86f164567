"""Snakemake entry point for rule `merged` (logic: draftsmith.merged.stage.merged)."""

from draftsmith.merged.stage import merged
from draftsmith.runtime.jobs import from_snakemake

from_snakemake(snakemake, merged)  # noqa: F821 (injected by Snakemake)
