"""Snakemake entry point for rule `evaluate` (logic: draftsmith.evaluate.stage.evaluate)."""

from draftsmith.evaluate.stage import evaluate
from draftsmith.runtime.jobs import from_snakemake

from_snakemake(snakemake, evaluate)  # noqa: F821 (injected by Snakemake)
