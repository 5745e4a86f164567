"""Snakemake entry point for rule `evaluate` (logic: draftsmith.evaluate.stage.evaluate_draft)."""

from draftsmith.evaluate.stage import evaluate_draft
from draftsmith.stages import from_snakemake

from_snakemake(snakemake, evaluate_draft)  # noqa: F821 (injected by Snakemake)
