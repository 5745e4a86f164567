"""Snakemake entry point for rule `responses` (logic: draftsmith.responses.stage.responses)."""

from draftsmith.responses.stage import responses
from draftsmith.runtime.jobs import from_snakemake

from_snakemake(snakemake, responses)  # noqa: F821 (injected by Snakemake)
