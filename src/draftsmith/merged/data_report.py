"""The data report: per dataset samples, bad rows, tokens, truncation, round trips, cost,
the prompts and replies holding special-token text (control tokens in a prompt, plain
text in a reply: `draftsmith.tokens.chat`), and the conversations: target-written turns
per conversation, tool calls matched, conversations ended early (`responses.turns`),
replies with reasoning and the supervised share of the tokens."""

from __future__ import annotations

COLUMNS = [
    ("dataset", "dataset"),
    ("rows", "rows"),
    ("bad_rows", "bad rows"),
    ("generated", "generated"),
    ("merged", "merged"),
    ("tokens", "tokens"),
    ("supervised_tokens", "supervised"),
    ("supervised_share", "supervised share"),
    ("turns_per_conversation", "turns/conversation"),
    ("regenerated_turns", "regenerated turns"),
    ("tool_calls_matched", "tool calls matched"),
    ("ended_early", "ended early"),
    ("with_reasoning", "with reasoning"),
    ("truncated", "truncated"),
    ("dropped", "dropped"),
    ("roundtrip_mismatch_rate", "round-trip mismatch"),
    ("prompts_with_special_text", "prompts with special text"),
    ("replies_with_special_text", "replies with special text"),
    ("cost_usd", "cost $"),
]


def dataset_row(name: str, responses: dict, tokens: dict, merged: int) -> dict:
    return _shares(
        {
            "dataset": name,
            "rows": responses["rows"],
            "bad_rows": responses["bad_rows"],
            "generated": responses["samples"],
            "completion_tokens": responses["completion_tokens"],
            "cost_usd": responses["cost_usd"],
            "merged": merged,
            "tokens": tokens["tokens"],
            "supervised_tokens": tokens["supervised_tokens"],
            "truncated": tokens["truncated"],
            "dropped": tokens["dropped_no_supervised"],
            "with_backend_ids": tokens["with_backend_ids"],
            "roundtrip_mismatch_rate": tokens["roundtrip_mismatch_rate"],
            "prompts_with_special_text": tokens["prompts_with_special_text"],
            "replies_with_special_text": tokens["replies_with_special_text"],
            # Manifests written before conversations were counted: one turn per prompt.
            "conversations": responses.get("conversations", responses["samples"]),
            "regenerated_turns": responses.get("regenerated_turns", responses["samples"]),
            "tool_calls_matched": responses.get("tool_calls_matched", 0),
            "ended_early": responses.get("ended_early", 0),
            "with_reasoning": responses.get("with_reasoning", 0),
        }
    )


def _shares(row: dict) -> dict:
    """A row of counts with its ratios added."""
    supervised = row["supervised_tokens"] / row["tokens"] if row["tokens"] else None
    turns = row["regenerated_turns"] / row["conversations"] if row["conversations"] else None
    return row | {"supervised_share": supervised, "turns_per_conversation": turns}


def totals(rows: list[dict]) -> dict:
    summed = (
        "rows",
        "bad_rows",
        "generated",
        "merged",
        "tokens",
        "supervised_tokens",
        "truncated",
        "dropped",
        "prompts_with_special_text",
        "replies_with_special_text",
        "completion_tokens",
        "cost_usd",
        "conversations",
        "regenerated_turns",
        "tool_calls_matched",
        "ended_early",
        "with_reasoning",
    )
    total = _shares({k: sum(r[k] for r in rows) for k in summed})
    total["dataset"] = "total"
    total["cost_usd"] = round(total["cost_usd"], 6)
    checked = [r for r in rows if r["roundtrip_mismatch_rate"] is not None]
    total["roundtrip_mismatch_rate"] = (
        sum(r["roundtrip_mismatch_rate"] * r["with_backend_ids"] for r in checked)
        / max(sum(r["with_backend_ids"] for r in checked), 1)
        if checked
        else None
    )
    return total


def _cell(value) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.4f}" if value < 1 else f"{value:,.2f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def markdown(report: dict) -> str:
    rows = report["datasets"] + [report["total"]]
    head = "| " + " | ".join(title for _, title in COLUMNS) + " |"
    rule = "|" + "|".join("---" for _ in COLUMNS) + "|"
    body = ["| " + " | ".join(_cell(r[k]) for k, _ in COLUMNS) + " |" for r in rows]
    lines = [
        f"# Data report: {report['experiment']}",
        "",
        f"merged key `{report['key']}`, seed {report['seed']}, max_length {report['max_length']}",
        "",
        head,
        rule,
        *body,
        "",
    ]
    if report["excluded"]:
        lines.append(f"Excluded from the merge: {', '.join(report['excluded'])}")
    return "\n".join(lines) + "\n"
