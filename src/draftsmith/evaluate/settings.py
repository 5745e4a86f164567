"""The evaluator's settings (`EvaluateSettings`, its trees and length buckets checked as they
are built), benchmark.json's results by setting label, and the recommended SGLang launch in
Markdown.

No torch here: config validation and the report import this module.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from itertools import pairwise

from draftsmith.config import export_serving_context
from draftsmith.errors import ConfigError
from draftsmith.runtime.resources import evaluate_gpus
from draftsmith.speculation import Speculation


@dataclass(frozen=True)
class PromptSetEntry:
    """One `evaluate.prompt_sets` entry, by name."""

    name: str
    path: str
    format: str
    prompt_field: str
    max_prompts: int | None

    @classmethod
    def of(cls, name: str, entry: dict) -> PromptSetEntry:
        return cls(name, entry["path"], entry["format"], entry["prompt_field"], entry["max_prompts"])

    def as_entry(self) -> dict:
        """The config-shaped entry `formats.prompt_sets.load_prompt_set` reads."""
        return {key: value for key, value in asdict(self).items() if key != "name"}


@dataclass(frozen=True)
class EvaluateSettings:
    """What the evaluate job reads: the settings it measures, how it decodes, what it flags."""

    chains: tuple[Speculation, ...]  # evaluate.k, in config order
    trees: tuple[Speculation, ...]  # evaluate.trees, in config order
    max_new_tokens: int
    device: str
    dtype: str  # both models' compute dtype
    warmup_prompts: int
    length_buckets: tuple[int, ...]  # strictly ascending upper bounds
    long_context_drop: float
    prompt_set_drop: float
    prompt_sets: tuple[PromptSetEntry, ...]  # by name
    system_prompt: str | None  # generation.system_prompt: prompts render as the training ones did
    trust_remote_code: bool  # model.trust_remote_code
    training_max_length: int  # tokenize.max_length: the longest sample the draft trained on
    # The context the recommended launch serves: the one the draft is exported for
    # (export.serving_context, else train.max_position_embeddings). Derived from the export's
    # settings, which its key holds, so the command never shows a setting the key does not.
    launch_context: int
    gpus: int  # GPUs the job holds (`runtime.resources.evaluate_gpus`)

    @property
    def measured(self) -> tuple[Speculation, ...]:
        """Every setting decoded: chains in k order, then trees in config order."""
        return self.chains + self.trees

    @classmethod
    def of(cls, config: dict) -> EvaluateSettings:
        """Refuses an `evaluate.trees` entry the evaluator cannot build or SGLang would not run
        as given, and length buckets that are not strictly ascending."""
        ev = config["evaluate"]
        bounds = tuple(ev["length_buckets"])
        if any(low >= high for low, high in pairwise(bounds)):
            raise ConfigError(
                f"evaluate.length_buckets: upper bounds must be strictly ascending, got {list(bounds)}"
            )
        trees = tuple(Speculation.of(tree) for tree in ev["trees"])
        for i, tree in enumerate(trees):
            try:
                tree.check()
            except ValueError as exc:
                raise ConfigError(f"evaluate.trees[{i}]: {exc}") from None
        sets = tuple(PromptSetEntry.of(name, e) for name, e in sorted(ev["prompt_sets"].items()))
        return cls(
            chains=tuple(Speculation.chain(k) for k in ev["k"]),  # valid by the schema's k >= 1
            trees=trees,
            max_new_tokens=ev["max_new_tokens"],
            device=ev["device"],
            dtype=ev["dtype"],
            warmup_prompts=ev["warmup_prompts"],
            length_buckets=bounds,
            long_context_drop=ev["long_context_drop"],
            prompt_set_drop=ev["prompt_set_drop"],
            prompt_sets=sets,
            system_prompt=config["generation"]["system_prompt"],
            trust_remote_code=config["model"]["trust_remote_code"],
            training_max_length=config["tokenize"]["max_length"],
            launch_context=export_serving_context(config),
            gpus=evaluate_gpus(config),
        )


def labelled_results(prompt_set: dict) -> list[tuple[str, dict]]:
    """A benchmark.json prompt set's results by setting label: chains in k order, then trees."""
    chains = sorted((int(k), result) for k, result in prompt_set["by_k"].items())
    trees = [(Speculation.of(result).label, result) for result in prompt_set["by_tree"].values()]
    return [(Speculation.chain(k).label, result) for k, result in chains] + trees


def best_result(prompt_set: dict) -> tuple[str, dict]:
    """The label and result of a prompt set's fastest setting, chain or tree (the first of equals)."""
    return max(labelled_results(prompt_set), key=lambda item: item[1]["speedup"])


def recommendation_markdown(recommended: dict) -> str:
    """The `Recommended SGLang settings` section of benchmark.json's `recommended`."""
    slower = (
        " No setting beat the target alone here: serving without the draft is faster on these prompts."
        if recommended["mean_speedup"] <= 1
        else ""
    )
    return (
        "## Recommended SGLang settings\n\n"
        f"{recommended['setting']}: the best speed-up over the prompt sets, "
        f"{recommended['mean_speedup']:.2f}x (the mean of the per-set speed-ups).{slower} "
        + launch_markdown(recommended)
    )


def launch_markdown(recommended: dict) -> str:
    """A recommended setting's SGLang flags, its example launch and whether SGLang's own
    parser read it (`flags`, `command`, `placeholders`, `checked_by_sglang`)."""
    placeholders = recommended["placeholders"]
    checked = (
        "yes"
        if recommended["checked_by_sglang"]
        else "no (SGLang is not installed where the evaluation ran; the flags are the ones "
        "draftsmith knows SGLang by)"
    )
    return (
        f"SGLang flags: `{' '.join(recommended['flags'])}`.\n\n"
        "Example launch, with TARGET_MODEL the target model (this evaluation read "
        f"`{placeholders['TARGET_MODEL']}`) and DRAFT_DIR the export's SGLang draft "
        f"(`{placeholders['DRAFT_DIR']}`):\n\n"
        f"`{recommended['command']}`\n\n"
        f"Checked by SGLang's own argument parser: {checked}.\n"
    )
