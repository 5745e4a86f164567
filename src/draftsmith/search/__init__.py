"""Stage `search`: successive halving (`halving`) over a grid of speculative settings
(`grid`), decoded by the built-in evaluator on one held-out prompt set, and the rule's
entry (`stage`).

Exported for the report and the serving benchmark: search.json's Markdown and its best
settings (`summary`)."""

from draftsmith.search.summary import search_markdown, top_settings

__all__ = ["search_markdown", "top_settings"]
