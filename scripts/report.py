"""Snakemake entry point for rule `report` (logic: draftsmith.report.stage.report)."""

from draftsmith.report.stage import report
from draftsmith.runtime.jobs import from_snakemake

from_snakemake(snakemake, report)  # noqa: F821 (injected by Snakemake)
