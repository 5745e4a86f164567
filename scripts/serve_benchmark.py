"""Snakemake entry point for rule `serve_benchmark` (logic: draftsmith.serving.bench.serve_benchmark)."""

from draftsmith.serving.bench import serve_benchmark
from draftsmith.stages import from_snakemake

from_snakemake(snakemake, serve_benchmark)  # noqa: F821 (injected by Snakemake)
