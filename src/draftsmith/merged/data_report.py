"""The data report: per dataset samples, bad rows, tokens, truncation, round trips, cost,
and the prompts and replies holding special-token text (control tokens in a prompt,
plain text in a reply: `draftsmith.tokens.chat`)."""

from __future__ import annotations

COLUMNS = [
    ("dataset", "dataset"),
    ("rows", "rows"),
    ("bad_rows", "bad rows"),
    ("generated", "generated"),
    ("merged", "merged"),
    ("tokens", "tokens"),
    ("supervised_tokens", "supervised"),
    ("truncated", "truncated"),
    ("dropped", "dropped"),
    ("roundtrip_mismatch_rate", "round-trip mismatch"),
    ("prompts_with_special_text", "prompts with special text"),
    ("replies_with_special_text", "replies with special text"),
    ("cost_usd", "cost $"),
]


def dataset_row(name: str, responses: dict, tokens: dict, merged: int) -> dict:
    return {
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
    }


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
    )
    total = {k: sum(r[k] for r in rows) for k in summed}
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
