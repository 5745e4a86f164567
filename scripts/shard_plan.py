"""Snakemake entry point for rule `shard_plan` (logic: draftsmith.stages.shard_plan)."""

from draftsmith.stages import from_snakemake, shard_plan

from_snakemake(snakemake, shard_plan)  # noqa: F821 (injected by Snakemake)
