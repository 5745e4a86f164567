"""Snakemake entry point for rule `draft_vocab` (logic: draftsmith.stages.build_draft_vocab)."""

from draftsmith.stages import build_draft_vocab, from_snakemake

from_snakemake(snakemake, build_draft_vocab)  # noqa: F821 (injected by Snakemake)
