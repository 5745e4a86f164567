"""Snakemake entry point for rule `hidden_assign` (logic: draftsmith.hidden.stage.hidden_assign)."""

from draftsmith.hidden.stage import hidden_assign
from draftsmith.runtime.jobs import from_snakemake

from_snakemake(snakemake, hidden_assign)  # noqa: F821 (injected by Snakemake)
