"""What the Snakefile (and `draftsmith plan`) does first: validate a config once, plan it,
and resolve each stage's typed settings.

Validation is the schema (`config.validate`) plus every cross-field rule a stage owns about
its own settings (the evaluator's trees, the settings search's prompt set and grid, the
serving benchmark's launch refusals), checked while building that stage's frozen settings,
so a bad setting fails before any job runs, with the key path at fault. Rules hand each job
its stage's settings and its planned `Artifact` as params; no job re-reads the raw config.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from draftsmith import config as cfg
from draftsmith.errors import ConfigError
from draftsmith.evaluate.settings import EvaluateSettings
from draftsmith.export.settings import ExportSettings
from draftsmith.hidden.settings import HiddenSettings
from draftsmith.merged.settings import MergedSettings
from draftsmith.model.settings import ModelSettings
from draftsmith.report.settings import ReportSettings
from draftsmith.responses.settings import ResponsesSettings
from draftsmith.search.settings import SearchSettings
from draftsmith.serve_bench.settings import ServeBenchSettings
from draftsmith.store.plan import Plan, plan_for
from draftsmith.tokens.settings import TokensSettings
from draftsmith.train.settings import TrainSettings
from draftsmith.vocab.settings import VocabSettings


@dataclass(frozen=True)
class Settings:
    """A validated config, resolved: its artifact plan and each stage's settings."""

    plan: Plan
    model: ModelSettings
    responses: Mapping[str, ResponsesSettings]  # by generated dataset
    tokens: Mapping[str, TokensSettings]  # by generated dataset
    merged: MergedSettings
    vocab: VocabSettings
    hidden: HiddenSettings
    train: TrainSettings
    export: ExportSettings
    evaluate: EvaluateSettings | None  # None: evaluate.enabled is false
    search: SearchSettings | None  # None: the search is off (`config.stage_on`)
    serve_bench: ServeBenchSettings | None  # None: serve_benchmark.enabled is false
    report: ReportSettings


def configure(config: dict, source: str = "config") -> Settings:
    """Validate `config` in place (defaults filled in) and resolve it: plan and settings."""
    cfg.validate(config, source)
    try:
        # One line per stage: its settings, checked as they are built.
        stages = {
            "model": ModelSettings.of(config),
            "responses": ResponsesSettings.per_dataset(config),
            "tokens": TokensSettings.per_dataset(config),
            "merged": MergedSettings.of(config),
            "vocab": VocabSettings.of(config),
            "hidden": HiddenSettings.of(config),
            "train": TrainSettings.of(config),
            "export": ExportSettings.of(config),
            "evaluate": EvaluateSettings.of(config) if cfg.stage_on(config, "evaluate") else None,
            "search": SearchSettings.of(config) if cfg.stage_on(config, "search") else None,
            "serve_bench": ServeBenchSettings.of(config) if cfg.stage_on(config, "serve_bench") else None,
            "report": ReportSettings.of(config),
        }
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    plan = plan_for(config)
    _check_shared_sources(config, plan, source)
    return Settings(plan=plan, **stages)


# What decides a dataset's prompts: two datasets alike in these read the same prompts.
PROMPT_PARAMS = ("source", "format", "prompt_field", "split")


def _check_shared_sources(config: dict, plan: Plan, source: str) -> None:
    """Refuse datasets that read the same prompts (by the plan's source hashes, so a copy or
    a link counts) unless each says it is meant: they would be generated and merged twice."""
    readers: dict[tuple, list[str]] = {}
    for name in plan.generated_datasets:
        params = plan.responses[name].params
        readers.setdefault(tuple(params[k] for k in PROMPT_PARAMS), []).append(name)
    for names in readers.values():
        if len(names) > 1 and not all(config["datasets"][n]["shared_source"] for n in names):
            paths = ", ".join(dict.fromkeys(config["datasets"][n]["path"] for n in names))
            raise ConfigError(
                f"{source}: datasets {', '.join(names)} read the same content ({paths}): each "
                "would be generated and merged, training on the same prompts twice; remove all "
                "but one, or set shared_source: true on each of them if that is meant (e.g. "
                "other generation settings)"
            )
