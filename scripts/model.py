"""Snakemake entry point for rule `model` (logic: draftsmith.model.stage.model)."""

from draftsmith.model.stage import model
from draftsmith.runtime.jobs import from_snakemake

from_snakemake(snakemake, model)  # noqa: F821 (injected by Snakemake)
