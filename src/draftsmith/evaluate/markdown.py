"""benchmark.md: the evaluation's Markdown, per prompt set the chain and tree tables, the
acceptance by prompt length, the prompt sets' comparison and the recommendation."""

from __future__ import annotations

from draftsmith.evaluate.length import length_markdown, long_context_markdown
from draftsmith.evaluate.sets import sets_markdown
from draftsmith.evaluate.settings import best_result, recommendation_markdown
from draftsmith.formats.markdown import coverage_sentence
from draftsmith.speculation import Speculation


def markdown(benchmark: dict) -> str:
    lines = [
        f"# Draft evaluation `{benchmark['key']}`",
        "",
        f"Chain and tree speculative decoding, greedy, checked lossless. Device: {benchmark['device']}, "
        f"dtype {benchmark['dtype']}, max_new_tokens {benchmark['max_new_tokens']}, "
        f"wall {benchmark['wall_s']:.1f} s.",
    ]
    warning = long_context_markdown(benchmark["long_context"])
    lines += ["", warning.rstrip()] if warning else []
    for name, result in benchmark["prompt_sets"].items():
        base = result["baseline"]
        lines += [
            "",
            f"## {name} ({result['prompts']} prompts)",
            "",
            f"Baseline (target alone): {base['tokens']} tokens in {base['seconds']:.2f} s. "
            f"{coverage_sentence(result['draft_vocab_coverage'])}",
            "",
            "| k | AL | acceptance rate | per-position acceptance | tok/s draft | tok/s baseline "
            "| speed-up |",
            "|---|---|---|---|---|---|---|",
        ]
        for k, r in result["by_k"].items():
            positions = " ".join(f"{p:.2f}" for p in r["per_position"])
            lines.append(
                f"| {k} | {r['acceptance_length']:.3f} | {r['acceptance_rate']:.3f} | {positions} | "
                f"{r['tokens_per_s']:.1f} | {base['tokens_per_s']:.1f} | {r['speedup']:.2f}x |"
            )
        lines += _tree_table(result)
        lines.append(length_markdown(result).rstrip())
        label, best = best_result(result)
        lines += ["", f"Best: {label}, {best['speedup']:.2f}x at AL {best['acceptance_length']:.3f}."]
    comparison = sets_markdown(benchmark["by_set"], benchmark["prompt_sets"])
    return "\n".join(lines) + "\n\n" + comparison + "\n" + recommendation_markdown(benchmark["recommended"])


def _tree_table(result: dict) -> list[str]:
    if not result["by_tree"]:
        return []
    lines = [
        "",
        "| tree (num_steps/topk/num_draft_tokens) | AL | bound num_steps+1 | per-depth acceptance "
        "| tok/s draft | tok/s baseline | speed-up |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in result["by_tree"].values():
        depths = " ".join(f"{p:.2f}" for p in r["per_depth"])
        lines.append(
            f"| {Speculation.of(r).shape} | {r['acceptance_length']:.3f} | {r['num_steps'] + 1} | "
            f"{depths} | {r['tokens_per_s']:.1f} | {result['baseline']['tokens_per_s']:.1f} | "
            f"{r['speedup']:.2f}x |"
        )
    return lines
