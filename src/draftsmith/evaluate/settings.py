"""The evaluator's decoding settings: the trees it can build (SGLang's num_steps, topk,
num_draft_tokens), their config check (and the length buckets'), the names people and
benchmark.json give settings, and the recommended SGLang launch in Markdown.

No torch here: config validation and the report import this module.
"""

from __future__ import annotations

from itertools import pairwise

from draftsmith.errors import ConfigError

BASELINE = "baseline"  # the per-prompt rows' setting of the target alone


def max_draft_tokens(num_steps: int, topk: int) -> int:
    """The most nodes a tree round can verify, root included: topk children of the root,
    then at each further step the topk children of each of the topk frontier nodes."""
    return 1 + topk + (num_steps - 1) * topk * topk


def check_tree(num_steps: int, topk: int, num_draft_tokens: int) -> None:
    """Raise ValueError unless the settings describe a tree `tree_speculative` can build."""
    if topk < 1:
        raise ValueError(f"topk must be >= 1, got {topk}")
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1, got {num_steps}")
    most = max_draft_tokens(num_steps, topk)
    if not 2 <= num_draft_tokens <= most:
        raise ValueError(
            f"num_draft_tokens must be between 2 and {most} (the root plus the nodes a tree of "
            f"num_steps={num_steps}, topk={topk} generates), got {num_draft_tokens}"
        )


def tree_shape(tree: dict) -> tuple[int, int, int]:
    """(num_steps, topk, num_draft_tokens) of a tree's config entry or benchmark.json result."""
    return tree["num_steps"], tree["topk"], tree["num_draft_tokens"]


def check_config(config: dict) -> None:
    """Refuse an `evaluate.trees` entry the evaluator cannot build or SGLang would not run as
    given, and length buckets that are not strictly ascending."""
    bounds = config["evaluate"]["length_buckets"]
    if any(low >= high for low, high in pairwise(bounds)):
        raise ConfigError(f"evaluate.length_buckets: upper bounds must be strictly ascending, got {bounds}")
    for i, tree in enumerate(config["evaluate"]["trees"]):
        where = f"evaluate.trees[{i}]"
        try:
            check_tree(*tree_shape(tree))
        except ValueError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        if tree["topk"] == 1 and tree["num_draft_tokens"] != tree["num_steps"] + 1:
            # SGLang replaces it by num_steps + 1 with only a warning: the recommendation would lie.
            raise ConfigError(
                f"{where}: topk 1 is a chain, which SGLang runs with num_draft_tokens = num_steps + 1 "
                f"({tree['num_steps'] + 1}), not {tree['num_draft_tokens']}"
            )


def chain_label(k: int) -> str:
    return f"k={k}"


def tree_text(tree: dict) -> str:
    """A tree as tables show it: num_steps/topk/num_draft_tokens."""
    return "/".join(map(str, tree_shape(tree)))


def tree_label(tree: dict) -> str:
    return f"tree {tree_text(tree)}"


def tree_key(tree: dict) -> str:
    """A tree's key under `by_tree` in benchmark.json."""
    return "-".join(map(str, tree_shape(tree)))


def labelled_results(prompt_set: dict) -> list[tuple[str, dict]]:
    """A benchmark.json prompt set's results by setting label: chains in k order, then trees."""
    chains = sorted((int(k), result) for k, result in prompt_set["by_k"].items())
    trees = [(tree_label(result), result) for result in prompt_set["by_tree"].values()]
    return [(chain_label(k), result) for k, result in chains] + trees


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
