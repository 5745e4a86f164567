"""Snakemake entry point for rule `hidden_estimate` (logic: draftsmith.hidden.stage.hidden_estimate)."""

from draftsmith.hidden.stage import hidden_estimate
from draftsmith.runtime.jobs import from_snakemake

from_snakemake(snakemake, hidden_estimate)  # noqa: F821 (injected by Snakemake)
