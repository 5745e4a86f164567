"""Snakemake entry point for rule `tokens` (logic: draftsmith.tokens.stage.tokens)."""

from draftsmith.runtime.jobs import from_snakemake
from draftsmith.tokens.stage import tokens

from_snakemake(snakemake, tokens)  # noqa: F821 (injected by Snakemake)
