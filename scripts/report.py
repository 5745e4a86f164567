"""Snakemake entry point for rule `report` (logic: draftsmith.reporting.build_report)."""

from draftsmith.reporting.build import build_report
from draftsmith.stages import from_snakemake

from_snakemake(snakemake, build_report)  # noqa: F821 (injected by Snakemake)
