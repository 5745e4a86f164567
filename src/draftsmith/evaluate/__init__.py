"""Stage `evaluate`: lossless chain and tree speculative decoding of held-out prompts with
the target and the exported draft (`spec_decode`), the settings' checks and names
(`settings`), and the rule's entry (`stage`).

Exported for the report: how benchmark.json names settings, and the recommendation's Markdown."""

from draftsmith.evaluate.settings import best_result, recommendation_markdown, tree_text

__all__ = ["best_result", "recommendation_markdown", "tree_text"]
