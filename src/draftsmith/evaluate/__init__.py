"""Stage `evaluate`: lossless chain and tree speculative decoding of held-out prompts with
the target and the exported draft (`spec_decode`, the trees in `tree_decode`), the prompt
sets measured with it (`measure`), the recommended SGLang launch (`launch`), benchmark.md
(`markdown`), the stage's settings with their checks and the recommendation's Markdown
(`settings`), and the rule's entry (`stage`).

Exported for the report: benchmark.json's best setting, and the Markdown of the
recommendation, of acceptance by prompt length and of the long-context warning (`length`),
and of acceptance by prompt set with its warning (`sets`).

Exported for the settings search and the serving benchmark: the evaluator's settings and a
prompt set's entry (`settings`). For the search also: the launch Markdown (`settings`), and
the rule's measuring machinery (`stage`: loading the models; `measure`: decoding prompts
with settings checked lossless; `launch`: the launch command). The machinery loads on first
use (`stage` imports torch): config validation and the report stay torch-free."""

from typing import Any

from draftsmith.evaluate.length import length_markdown, long_context_markdown
from draftsmith.evaluate.sets import sets_markdown, sets_warning
from draftsmith.evaluate.settings import (
    EvaluateSettings,
    PromptSetEntry,
    best_result,
    launch_markdown,
    recommendation_markdown,
)

# Loaded on first use: name -> the module of this package that holds it.
_LAZY = {
    "DRAFT_DIR": "launch",
    "TARGET_MODEL": "launch",
    "Launch": "launch",
    "command_line": "launch",
    "sglang_launch": "launch",
    "Settings": "measure",
    "benchmark_sets": "measure",
    "device_name": "stage",
    "load_models": "stage",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from draftsmith.evaluate import launch, measure, stage

        modules = {"launch": launch, "measure": measure, "stage": stage}
        return getattr(modules[_LAZY[name]], name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    *_LAZY,
    "EvaluateSettings",
    "PromptSetEntry",
    "best_result",
    "launch_markdown",
    "length_markdown",
    "long_context_markdown",
    "recommendation_markdown",
    "sets_markdown",
    "sets_warning",
]
