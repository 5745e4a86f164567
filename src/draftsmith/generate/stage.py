"""Drive one dataset through a generation backend, resumably.

Finished records go to a journal beside the declared outputs as they complete;
a rerun after kill -9 or Ctrl-C sends nothing for a sample already in the
journal. The declared `responses.jsonl` appears atomically, in prompt order,
only when every prompt is done. The journal is kept: a kill between that write
and Snakemake's bookkeeping makes Snakemake rerun (and first delete) a finished
output, and the journal then answers every prompt without a request.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from draftsmith import atomic, manifest
from draftsmith.datasets import LoadedDataset, Prompt
from draftsmith.generate.records import Usage, record_usage
from draftsmith.jobs import TokenRate, progress
from draftsmith.journal import Journal

log = logging.getLogger("draftsmith.generate")

JOURNAL_NAME = "journal.jsonl"


class Backend(Protocol):
    def generate(self, prompts: list[Prompt], emit: Callable[[dict], None], spent: Usage) -> None:
        """Generate a record for each prompt and pass it to `emit` as soon as it is done.

        `spent` is the usage already journaled (for budget caps); backends may
        raise `BudgetReached` to stop cleanly.
        """


def cost_usd(usage: Usage, openai_cfg: dict) -> float:
    return (
        usage.prompt_tokens * openai_cfg["price_per_million_input"]
        + usage.completion_tokens * openai_cfg["price_per_million_output"]
    ) / 1e6


def run(
    *,
    dataset: str,
    loaded: LoadedDataset,
    backend: Backend,
    out_dir: Path,
    key: str,
    params: dict,
    upstream: dict[str, str],
    openai_cfg: dict,
) -> dict:
    started = time.time()
    journal = Journal(out_dir / JOURNAL_NAME)
    if journal.torn_lines:
        log.warning("journal: dropped %d torn line(s) from an interrupted run", journal.torn_lines)
    done = [p for p in loaded.prompts if p.id in journal]
    pending = [p for p in loaded.prompts if p.id not in journal]
    log.info(
        "%s: %d prompts, %d already in the journal, %d to generate",
        dataset,
        len(loaded.prompts),
        len(done),
        len(pending),
    )
    spent = Usage()
    for p in done:
        spent.add(record_usage(journal.records[p.id]))

    bar = progress(len(loaded.prompts), f"generate {dataset}", initial=len(done))
    rate = TokenRate()

    def emit(record: dict) -> None:
        journal.append(record)
        bar.update(1)
        bar.set_postfix_str(rate.add(record["usage"]["completion_tokens"]), refresh=False)

    try:
        backend.generate(pending, emit, spent)
    finally:
        bar.close()
        journal.close()

    records = [journal.records[p.id] for p in loaded.prompts]
    usage = Usage()
    for record in records:
        usage.add(record_usage(record))
    atomic.write_jsonl(out_dir / "responses.jsonl", records)
    atomic.write_jsonl(out_dir / "bad_rows.jsonl", [b.as_dict() for b in loaded.bad_rows])
    stats = {
        "rows": loaded.total_rows,
        "samples": len(records),
        "bad_rows": len(loaded.bad_rows),
        "skipped_over_cap": loaded.skipped_over_cap,
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "cost_usd": round(cost_usd(usage, openai_cfg), 6),
        "finish_reasons": _count(r["finish_reason"] for r in records),
        "with_token_ids": sum(r["response_token_ids"] is not None for r in records),
        "with_reasoning": sum(bool(r["reasoning"]) for r in records),
    }
    manifest.write(
        out_dir / manifest.MANIFEST_NAME,
        stage="responses",
        key=key,
        files=[out_dir / "responses.jsonl", out_dir / "bad_rows.jsonl"],
        params=params,
        upstream=upstream,
        stats=stats,
        started=started,
    )
    return stats


def _count(values) -> dict[str, int]:
    counts: dict[str, int] = {}
    for value in values:
        counts[str(value)] = counts.get(str(value), 0) + 1
    return counts
