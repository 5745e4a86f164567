"""The evaluator's settings: the config check of its trees (and of the length buckets),
benchmark.json's results by setting label, and the recommended SGLang launch in Markdown.

No torch here: config validation and the report import this module.
"""

from __future__ import annotations

from itertools import pairwise

from draftsmith.errors import ConfigError
from draftsmith.speculation import Speculation


def check_config(config: dict) -> None:
    """Refuse an `evaluate.trees` entry the evaluator cannot build or SGLang would not run as
    given, and length buckets that are not strictly ascending."""
    bounds = config["evaluate"]["length_buckets"]
    if any(low >= high for low, high in pairwise(bounds)):
        raise ConfigError(f"evaluate.length_buckets: upper bounds must be strictly ascending, got {bounds}")
    for i, tree in enumerate(config["evaluate"]["trees"]):
        try:
            Speculation.of(tree).check()
        except ValueError as exc:
            raise ConfigError(f"evaluate.trees[{i}]: {exc}") from None


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
