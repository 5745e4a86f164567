"""Snakemake entry point for rule `hidden_shard` (logic: draftsmith.hidden.stage.hidden_shard)."""

from draftsmith.hidden.stage import hidden_shard
from draftsmith.runtime.jobs import from_snakemake

from_snakemake(snakemake, hidden_shard)  # noqa: F821 (injected by Snakemake)
