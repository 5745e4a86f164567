"""The per-run summary Markdown: data, hidden-state estimate, training end figures, benchmark."""

from __future__ import annotations

from draftsmith.evaluate import (
    best_result,
    length_markdown,
    long_context_markdown,
    recommendation_markdown,
    sets_markdown,
    sets_warning,
)
from draftsmith.formats.markdown import coverage_sentence, fmt, table
from draftsmith.speculation import Speculation


def by_k(prompt_set: dict) -> list[tuple[int, dict]]:
    """A prompt set's per-k results in ascending k (JSON keys are strings)."""
    return sorted((int(k), entry) for k, entry in prompt_set["by_k"].items())


def benchmark_markdown(
    experiment: str,
    data_report: dict,
    estimate: dict,
    train_summary: dict,
    benchmark: dict | None,
    serving: str | None = None,
    search: str | None = None,
) -> str:
    """The run on one page. `benchmark` is the built-in evaluation (None when the config
    turns it off); `serving` the serving benchmark's Markdown, when it ran; `search` the
    settings search's section, when it ran."""
    if benchmark is not None:
        head = [
            _verdict(benchmark),
            long_context_markdown(benchmark["long_context"]),
            sets_warning(benchmark["by_set"]).lstrip(),
            _setup(benchmark),
        ]
        results = [_prompt_set(name, entry) for name, entry in sorted(benchmark["prompt_sets"].items())]
        results.append(sets_markdown(benchmark["by_set"], benchmark["prompt_sets"]))
        results.append(recommendation_markdown(benchmark["recommended"]))
    else:
        head = ["No built-in evaluation in this config (`evaluate.enabled: false`).\n"]
        results = []
    if search is not None:
        results.append(search)
    if serving is not None:
        results.append("## Serving benchmark (SGLang)\n\n" + _demote_headings(serving))
    sections = [
        f"# Benchmark report: {experiment}\n",
        *head,
        "## Data\n",
        _data(data_report),
        "## Hidden-state estimate\n",
        _estimate(estimate),
        "## Training\n",
        _training(train_summary),
        *results,
    ]
    return "\n".join(sections)


def _demote_headings(markdown: str) -> str:
    """Nest another report's headings under this page's section."""
    return "\n".join("##" + line if line.startswith("#") else line for line in markdown.splitlines()) + "\n"


def _verdict(benchmark: dict) -> str:
    if benchmark["lossless"]:
        return "**Lossless: yes.** Every speculative output equals the target's own greedy output.\n"
    return (
        "**Lossless: NO.** At least one speculative output differs from the target's greedy "
        "output: the draft or the verifier is wrong, and the speed-ups below do not count.\n"
    )


def _setup(benchmark: dict) -> str:
    ks = ", ".join(str(k) for k in benchmark["k"])
    trees = ", ".join(Speculation.of(tree).shape for tree in benchmark["trees"]) or "none"
    return (
        f"Evaluation key `{benchmark['key']}`: device {benchmark['device']}, dtype {benchmark['dtype']}, "
        f"up to {benchmark['max_new_tokens']} new tokens per prompt, k (draft tokens per verify "
        f"step) in {ks}, trees (num_steps/topk/num_draft_tokens) {trees}; the evaluation took "
        f"{fmt(benchmark['wall_s'], 1)} s.\n"
    )


def _data(report: dict) -> str:
    total = report["total"]
    headers = ["datasets", "rows", "bad rows", "merged samples", "tokens", "supervised tokens"]
    headers += ["round-trip mismatch", "cost $"]
    row = [len(report["datasets"]), fmt(total["rows"]), fmt(total["bad_rows"]), fmt(total["merged"])]
    row += [fmt(total["tokens"]), fmt(total["supervised_tokens"])]
    row += [fmt(total["roundtrip_mismatch_rate"], 4), fmt(total["cost_usd"])]
    note = f"Merged key `{report['key']}`, seed {report['seed']}, max_length {report['max_length']}."
    return table(headers, [row]) + f"\n{note} Per dataset: the data report.\n"


def _estimate(report: dict) -> str:
    headers = ["shards to extract", "samples", "already stored", "tokens to forward", "storage"]
    headers += ["bytes to write", "free disk", "estimated hours"]
    row = [fmt(report["shards_to_extract"]), fmt(report["samples"]), fmt(report["stored_samples"])]
    row += [fmt(report["tokens"]), report["storage_mode"]]
    row += [f"{report['bytes_needed'] / 1e9:.3f} GB", f"{report['free_bytes'] / 1e9:.2f} GB"]
    row += [fmt(report["estimated_hours"])]
    return table(headers, [row])


def _training(summary: dict) -> str:
    headers = ["steps", "epochs", "tokens seen", "wall time", "tokens/s", "end train loss", "end val loss"]
    val = summary["end"]["val"]
    row = [fmt(summary["steps"]), fmt(summary["epochs"]), fmt(summary["tokens_seen"])]
    row += [f"{fmt(summary['wall_s'], 1)} s", fmt(summary["tok_s"], 1)]
    row += [fmt(summary["end"]["train"]["loss"], 3), fmt(val["loss"], 3) if val else "n/a"]
    return table(headers, [row]) + "\n" + _positions(summary)


def _positions(summary: dict) -> str:
    """End loss and accuracy per TTT position: train over the last segment, val at the end."""
    train, val = summary["end"]["train"], summary["end"]["val"]
    rows = []
    for j in range(summary["ttt_steps"]):
        row = [j + 1, fmt(train["loss_pos"][j], 3), fmt(train["acc_pos"][j], 3)]
        row += [fmt(val["loss_pos"][j], 3), fmt(val["acc_pos"][j], 3)] if val else ["n/a", "n/a"]
        rows.append(row)
    first, last = train["steps"]
    note = f"Train: token-weighted over steps {first}-{last}; val: the held-out split at the last step."
    return table(["TTT position", "train loss", "train acc", "val loss", "val acc"], rows) + f"\n{note}\n"


def _prompt_set(name: str, entry: dict) -> str:
    base = entry["baseline"]
    rows = [
        [
            k,
            fmt(r["acceptance_length"]),
            _spread(r),
            k + 1,
            fmt(r["acceptance_rate"], 3),
            " / ".join(fmt(p, 2) for p in r["per_position"]),
            fmt(r["verify_steps"]),
            fmt(r["tokens"]),
            fmt(r["tokens_per_s"], 1),
            f"{r['speedup']:.2f}x",
        ]
        for k, r in by_k(entry)
    ]
    headers = ["k", "acceptance length", "one prompt's, lowest-highest", "bound k+1", "acceptance rate"]
    headers += ["per position"]
    headers += ["verify steps", "tokens", "tokens/s", "speed-up"]
    label, best = best_result(entry)
    return (
        f"## Prompt set `{name}` ({fmt(entry['prompts'])} prompts)\n\n"
        f"Baseline (target alone): {fmt(base['tokens'])} tokens in {fmt(base['seconds'], 2)} s, "
        f"{fmt(base['tokens_per_s'], 1)} tokens/s. {coverage_sentence(entry['draft_vocab_coverage'])}\n\n"
        + table(headers, rows)
        + _trees(entry)
        + length_markdown(entry)
        + f"\nBest: {label}, {best['speedup']:.2f}x at acceptance length "
        f"{best['acceptance_length']:.2f}.\n"
    )


def _spread(result: dict) -> str:
    """The lowest and highest acceptance length of one prompt at a setting."""
    low, high = result["acceptance_length_range"]
    return f"{fmt(low)}-{fmt(high)}"


def _trees(entry: dict) -> str:
    """The tree settings' table (none when the evaluation measured chains only)."""
    if not entry["by_tree"]:
        return ""
    rows = [
        [
            Speculation.of(r).shape,
            fmt(r["acceptance_length"]),
            _spread(r),
            r["num_steps"] + 1,
            " / ".join(fmt(p, 2) for p in r["per_depth"]),
            fmt(r["verify_steps"]),
            fmt(r["tokens"]),
            fmt(r["tokens_per_s"], 1),
            f"{r['speedup']:.2f}x",
        ]
        for r in entry["by_tree"].values()
    ]
    headers = ["tree (num_steps/topk/num_draft_tokens)", "acceptance length", "one prompt's, lowest-highest"]
    headers += ["bound num_steps+1"]
    headers += ["per depth", "verify steps", "tokens", "tokens/s", "speed-up"]
    return "\n" + table(headers, rows)
