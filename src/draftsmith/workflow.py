"""What the Snakefile (and `draftsmith plan`) does first: validate a config once, plan it,
and resolve each stage's typed settings.

Validation is the schema (`config.validate`) plus every cross-field rule a stage owns about
its own settings (the evaluator's trees, the settings search's prompt set and grid, the
serving benchmark's launch refusals), checked while building that stage's frozen settings,
so a bad setting fails before any job runs, with the key path at fault. Rules hand each job
its stage's settings and its planned `Artifact` as params; no job re-reads the raw config.
"""

from __future__ import annotations

from dataclasses import dataclass

from draftsmith import config as cfg
from draftsmith.errors import ConfigError
from draftsmith.evaluate.settings import check_config as check_evaluate
from draftsmith.search.grid import check_config as check_search
from draftsmith.serve_bench.command import check_config as check_serve_bench
from draftsmith.store.plan import Plan, plan_for
from draftsmith.vocab.settings import VocabSettings


@dataclass(frozen=True)
class Settings:
    """A validated config, resolved: its artifact plan and each stage's settings."""

    plan: Plan
    vocab: VocabSettings


def configure(config: dict, source: str = "config") -> Settings:
    """Validate `config` in place (defaults filled in) and resolve it: plan and settings."""
    cfg.validate(config, source)
    checks = [check_evaluate]
    checks += [check_search] if cfg.stage_on(config, "search") else []
    checks += [check_serve_bench] if cfg.stage_on(config, "serve_bench") else []
    try:
        for check in checks:
            check(config)
        # One line per stage: its settings, checked as they are built.
        stages = {
            "vocab": VocabSettings.of(config),
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
