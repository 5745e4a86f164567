"""Snakemake entry point for rule `vocab` (logic: draftsmith.vocab.stage.vocab)."""

from draftsmith.runtime.jobs import from_snakemake
from draftsmith.vocab.stage import vocab

from_snakemake(snakemake, vocab)  # noqa: F821 (injected by Snakemake)
