"""Acceptance by prompt length, and the flag for a draft that collapses on long context.

Drafts trained on short samples (or served without the target's RoPE scaling) often
accept well on short prompts and collapse beyond a few thousand tokens of context, which
a set-level acceptance length hides. `by_length` splits the per-prompt rows the
evaluator already wrote by prompt tokens (chat template included) into buckets of
`evaluate.length_buckets`: ascending upper bounds, the last bucket open above the last
bound (bounds [512, 2048, 8192] give `<512`, `512-2k`, `2k-8k`, `>=8k`). A bucket's
acceptance length is verify-step weighted like the set's, so the verify-step-weighted
mean of the bucket ALs is the set's AL.

`long_context` compares, per prompt set, each longer bucket's AL with the shortest
measured bucket's, for the recommended setting (or, with no recommendation, the fastest
chain): below `evaluate.long_context_drop` of it, the draft is flagged.

No torch here: the report imports this module.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from draftsmith.formats.markdown import fmt, table
from draftsmith.formats.prompt_sets import Bucket, bucket_of
from draftsmith.speculation import BASELINE, Speculation


@dataclass
class _Tally:
    prompts: int = 0
    tokens: Counter = field(default_factory=Counter)  # per setting: tokens from verify steps
    steps: Counter = field(default_factory=Counter)  # per setting: verify steps


def by_length(rows: list[dict], bounds: list[int]) -> dict[str, list[dict]]:
    """Each prompt set's `by_length` from the per-prompt rows (which carry `prompt_tokens`):
    per non-empty bucket the prompt count, and per setting label the acceptance length
    (None where the bucket's prompts made no verify step) and the verify steps."""
    tallies: dict[str, dict[Bucket, _Tally]] = {}
    for row in rows:
        bucket = bucket_of(row["prompt_tokens"], bounds)
        tally = tallies.setdefault(row["prompt_set"], {}).setdefault(bucket, _Tally())
        if row["setting"] == BASELINE:
            tally.prompts += 1
        else:
            tally.tokens[row["setting"]] += row["tokens"] - 1  # the first token is the prefill's
            tally.steps[row["setting"]] += row["verify_steps"]
    return {
        name: [_entry(b, t) for b, t in sorted(per.items(), key=lambda item: item[0].min_tokens)]
        for name, per in tallies.items()
    }


def _entry(bucket: Bucket, tally: _Tally) -> dict:
    lengths = {label: tally.tokens[label] / steps if steps else None for label, steps in tally.steps.items()}
    return {
        "bucket": bucket.label,
        "min_tokens": bucket.min_tokens,
        "max_tokens": bucket.max_tokens,
        "prompts": tally.prompts,
        "settings": lengths,
        "verify_steps": dict(tally.steps),
    }


def compared_setting(prompt_set: dict, recommended: dict | None) -> str:
    """The setting whose acceptance the flag compares: the recommended one, else the fastest chain."""
    if recommended is not None:
        return recommended["setting"]
    k, _ = max(prompt_set["by_k"].items(), key=lambda item: item[1]["speedup"])
    return Speculation.chain(int(k)).label


def long_context(prompt_sets: dict, recommended: dict | None, drop: float, draft: dict) -> dict:
    """benchmark.json's `long_context`: every bucket whose AL fell below `drop` times the
    shortest measured bucket's AL of its prompt set; `draft` is what is known of the
    draft's context (`draft_sentence`)."""
    fallen, compared = [], 0
    for name, entry in sorted(prompt_sets.items()):
        label = compared_setting(entry, recommended)
        measured = [b for b in entry["by_length"] if b["settings"].get(label) is not None]
        if len(measured) < 2:
            continue
        compared += 1
        short, reference = measured[0], measured[0]["settings"][label]
        for bucket in measured[1:]:
            if (length := bucket["settings"][label]) < drop * reference:
                fallen.append(
                    {
                        "prompt_set": name,
                        "setting": label,
                        "bucket": bucket["bucket"],
                        "prompts": bucket["prompts"],
                        "acceptance_length": length,
                        "reference_bucket": short["bucket"],
                        "reference_acceptance_length": reference,
                        "share": length / reference,
                    }
                )
    return {
        "flagged": bool(fallen),
        "threshold": drop,
        "buckets": fallen,
        "draft": draft,
        "reason": _reason(fallen, compared, drop, draft),
    }


def _reason(fallen: list[dict], compared: int, drop: float, draft: dict) -> str:
    if not compared:
        return "no prompt set has prompts in two length buckets: nothing to compare (add longer prompts)"
    if not fallen:
        return f"every longer bucket keeps at least {drop:.0%} of its shortest bucket's acceptance length"
    drops = "; ".join(map(_drop_text, fallen))
    return f"{drops} (below evaluate.long_context_drop {drop:.0%}). {draft_sentence(draft)}".rstrip()


def _drop_text(fall: dict) -> str:
    prompts = f"{fall['prompts']} prompt{'s' * (fall['prompts'] != 1)}"
    return (
        f"prompt set `{fall['prompt_set']}`, {fall['setting']}: acceptance length "
        f"{fall['acceptance_length']:.2f} at {fall['bucket']} prompt tokens ({prompts}), {fall['share']:.0%} "
        f"of {fall['reference_acceptance_length']:.2f} at {fall['reference_bucket']}"
    )


def draft_sentence(draft: dict) -> str:
    """What is known of the draft's context, as a sentence ("" when nothing is)."""
    parts = []
    if draft.get("training_max_length") is not None:
        longest = draft["training_max_length"]
        parts.append(f"trained on samples of at most {longest} tokens (tokenize.max_length)")
    if draft.get("max_position_embeddings") is not None:
        parts.append(f"exported with max_position_embeddings {draft['max_position_embeddings']}")
    if "rope_scaling" in draft:
        scaling = draft["rope_scaling"]
        parts.append(f"rope_scaling {scaling}" if scaling else "plain RoPE (no rope_scaling)")
    return f"The draft: {'; '.join(parts)}." if parts else ""


# --- Markdown -------------------------------------------------------------------------
def length_markdown(prompt_set: dict) -> str:
    """A prompt set's acceptance length per prompt-length bucket (rows) and setting (columns)."""
    rows = prompt_set["by_length"]
    labels = list(rows[0]["settings"]) if rows else []
    cells = [[r["bucket"], fmt(r["prompts"]), *(fmt(r["settings"][label]) for label in labels)] for r in rows]
    return "\nAcceptance length by prompt length (prompt tokens, chat template included):\n\n" + table(
        ["prompt tokens", "prompts", *labels], cells
    )


def long_context_markdown(flag: dict) -> str:
    """The long-context warning ("" when the draft holds up on long prompts)."""
    if not flag["flagged"]:
        return ""
    return (
        f"**Long-context warning:** {flag['reason']} Serve this draft for short prompts only, or "
        "train it on longer samples (tokenize.max_length, train.max_position_embeddings).\n"
    )
