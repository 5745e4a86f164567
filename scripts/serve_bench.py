"""Snakemake entry point for rule `serve_bench` (logic: draftsmith.serve_bench.stage.serve_bench)."""

from draftsmith.runtime.jobs import from_snakemake
from draftsmith.serve_bench.stage import serve_bench

from_snakemake(snakemake, serve_bench)  # noqa: F821 (injected by Snakemake)
