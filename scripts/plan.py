"""Snakemake entry point for rule `plan` (logic: draftsmith.stages.plan_report)."""

from draftsmith.stages import from_snakemake, plan_report

from_snakemake(snakemake, plan_report)  # noqa: F821 (injected by Snakemake)
