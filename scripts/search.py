"""Snakemake entry point for rule `search` (logic: draftsmith.search.stage.search)."""

from draftsmith.runtime.jobs import from_snakemake
from draftsmith.search.stage import search

from_snakemake(snakemake, search)  # noqa: F821 (injected by Snakemake)
