"""Acceptance per prompt set, and the flag for a draft that only works on some styles.

A draft trained on one kind of prompt (docstring requests, say) can accept well on its
own kind and poorly on chat or math, which one held-out set hides. `by_set` compares
the prompt sets at one setting, the recommended one (the one a user will serve): each
set's acceptance length and its share of the best set's. A set below
`evaluate.prompt_set_drop` of the best set's is flagged, so distribution mismatch shows
at a glance.

No torch here: the report imports this module.
"""

from __future__ import annotations

from draftsmith.evaluate.settings import labelled_results
from draftsmith.formats.markdown import fmt, table


def _result(prompt_set: dict, label: str) -> dict:
    return dict(labelled_results(prompt_set))[label]


def by_set(prompt_sets: dict, setting: str, drop: float) -> dict:
    """benchmark.json's `by_set`: per prompt set the AL and speed-up at `setting`, the
    share of the best set's AL, and which sets fall below `drop` of it."""
    lengths = {name: _result(prompt_sets[name], setting)["acceptance_length"] for name in sorted(prompt_sets)}
    best = max(lengths, key=lambda name: lengths[name])  # the first of equals
    sets = {
        name: {
            "acceptance_length": length,
            "speedup": _result(prompt_sets[name], setting)["speedup"],
            "share_of_best": length / lengths[best] if lengths[best] else 1.0,
        }
        for name, length in lengths.items()
    }
    fallen = [name for name, entry in sets.items() if entry["share_of_best"] < drop]
    return {
        "setting": setting,
        "best_set": best,
        "threshold": drop,
        "sets": sets,
        "flagged": fallen,
        "reason": _reason(sets, best, fallen, drop, setting),
    }


def _reason(sets: dict, best: str, fallen: list[str], drop: float, setting: str) -> str:
    if len(sets) < 2:
        return "one prompt set: nothing to compare (configure sets of other styles in evaluate.prompt_sets)"
    if not fallen:
        return f"every prompt set keeps at least {drop:.0%} of the best set's acceptance length at {setting}"
    falls = "; ".join(_fall_text(name, sets[name]) for name in fallen)
    return (
        f"at {setting}, acceptance length falls below {drop:.0%} of the best set's "
        f"(`{best}`, {sets[best]['acceptance_length']:.2f}) on {falls}"
    )


def _fall_text(name: str, entry: dict) -> str:
    return f"`{name}` {entry['acceptance_length']:.2f} ({entry['share_of_best']:.0%})"


def sets_markdown(comparison: dict, prompt_sets: dict) -> str:
    """Acceptance length per prompt set (rows) and setting (columns), the share of the best
    set's at the compared setting, and the warning when sets disagree."""
    names = list(comparison["sets"])
    labels = [label for label, _ in labelled_results(prompt_sets[names[0]])]
    cells = [
        [
            f"`{name}`",
            *(fmt(_result(prompt_sets[name], label)["acceptance_length"]) for label in labels),
            f"{comparison['sets'][name]['share_of_best']:.0%}",
        ]
        for name in names
    ]
    text = (
        "## Acceptance by prompt set\n\n"
        f"Acceptance length per set and setting; the last column is each set's share of the best "
        f"set's at {comparison['setting']}.\n\n"
        + table(["prompt set", *labels, f"share of best at {comparison['setting']}"], cells)
    )
    return text + sets_warning(comparison)


def sets_warning(comparison: dict) -> str:
    """The prompt-set warning ("" when the sets agree)."""
    if not comparison["flagged"]:
        return ""
    return (
        f"\n**Prompt-set warning:** {comparison['reason']} (evaluate.prompt_set_drop). The draft "
        "serves these styles poorly: add training data of their kind.\n"
    )
