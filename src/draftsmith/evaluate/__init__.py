"""Stage `evaluate`: lossless chain and tree speculative decoding of held-out prompts with
the target and the exported draft (`spec_decode`), the settings' checks and names
(`settings`), and the rule's entry (`stage`).

Exported for the report: how benchmark.json names settings, and the Markdown of the
recommendation, of acceptance by prompt length and of the long-context warning (`length`)."""

from draftsmith.evaluate.length import length_markdown, long_context_markdown
from draftsmith.evaluate.settings import best_result, recommendation_markdown, tree_text

__all__ = ["best_result", "length_markdown", "long_context_markdown", "recommendation_markdown", "tree_text"]
