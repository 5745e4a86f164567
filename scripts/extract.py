"""Snakemake entry point for rule `extract` (logic: draftsmith.stages.extract_shard)."""

from draftsmith.stages import extract_shard, from_snakemake

from_snakemake(snakemake, extract_shard)  # noqa: F821 (injected by Snakemake)
