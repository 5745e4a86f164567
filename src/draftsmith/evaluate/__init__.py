"""Stage `evaluate`: lossless chain and tree speculative decoding of held-out prompts with
the target and the exported draft (`spec_decode`), the trees' config check and the
recommendation's Markdown (`settings`), and the rule's entry (`stage`).

Exported for the report: benchmark.json's best setting, and the Markdown of the
recommendation, of acceptance by prompt length and of the long-context warning (`length`),
and of acceptance by prompt set with its warning (`sets`).

Exported for the settings search: the launch Markdown (`settings`), and the rule's
measuring machinery (`stage`: loading the models, decoding prompts with settings checked
lossless, the launch command). The stage's names import
torch, so they load on first use: config validation and the report stay torch-free."""

from typing import Any

from draftsmith.evaluate.length import length_markdown, long_context_markdown
from draftsmith.evaluate.sets import sets_markdown, sets_warning
from draftsmith.evaluate.settings import best_result, launch_markdown, recommendation_markdown

_FROM_STAGE = (
    "DRAFT_DIR",
    "TARGET_MODEL",
    "Launch",
    "Settings",
    "benchmark_sets",
    "command_line",
    "device_name",
    "load_models",
    "sglang_launch",
)


def __getattr__(name: str) -> Any:
    if name in _FROM_STAGE:
        from draftsmith.evaluate import stage

        return getattr(stage, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    *_FROM_STAGE,
    "best_result",
    "launch_markdown",
    "length_markdown",
    "long_context_markdown",
    "recommendation_markdown",
    "sets_markdown",
    "sets_warning",
]
