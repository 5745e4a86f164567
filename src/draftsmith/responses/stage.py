"""Drive one dataset through a generation backend, asking only what the answer store lacks.

Answers live in the store's answer store (`store.answers`), addressed by generation key
and prompt messages and shared by every dataset, key and experiment: a job holds its
generation key's lock, requests only the prompts with no stored answer (each distinct
prompt once), and stores each answer as it completes, so a rerun after kill -9 or Ctrl-C
sends nothing for an answer already stored. The declared `responses.jsonl` is assembled
from stored answers, atomically, in prompt order, once every prompt is answered; a kill
between that write and Snakemake's bookkeeping costs a rerun that requests nothing.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from draftsmith.errors import GenerationError
from draftsmith.formats.datasets.load import load_prompts
from draftsmith.formats.datasets.rows import LoadedDataset, Prompt
from draftsmith.formats.responses import Usage, record_usage
from draftsmith.fsutil import atomic
from draftsmith.responses import turns
from draftsmith.responses.settings import OpenAIGeneration, ResponsesSettings
from draftsmith.runtime import gpus
from draftsmith.runtime.jobs import TokenRate, progress
from draftsmith.store import answers, manifest
from draftsmith.store.plan import Artifact
from draftsmith.target.load import load_tokenizer, longest_token_chars, model_info, prompt_ids

log = logging.getLogger(__name__)


def responses(
    settings: ResponsesSettings,
    artifact: Artifact,
    inputs: dict,
    outputs: dict,
    log_file: str | None = None,
    *,
    answer_store: str,
) -> dict:
    """Rule `responses`: the target's answer to every prompt of one dataset. `answer_store`:
    the planned answer store of the dataset's generation key."""
    # The answer store's lock first, so a job waiting for its turn holds no GPU; GPUs are
    # leased before anything initialises CUDA and held until the last answer is written.
    with answers.opened(Path(answer_store)) as store, gpus.acquire_gpus(settings.gpus):
        return _responses(settings, artifact, store, inputs, outputs, log_file)


def _responses(
    settings: ResponsesSettings,
    artifact: Artifact,
    store: answers.AnswerStore,
    inputs: dict,
    outputs: dict,
    log_file: str | None,
) -> dict:
    dataset = artifact.dataset
    info = model_info(inputs["model"])
    tokenizer = load_tokenizer(info["hf_dir"], settings.trust_remote_code)

    def count_tokens(messages: list[dict], tools: list[dict] | None) -> int:
        return len(prompt_ids(tokenizer, messages, tools))

    loaded = load_prompts(
        dataset,
        settings.source.entry(),
        count_tokens,
        longest_token_chars(tokenizer),
        planned_sha256=artifact.params["source"],
    )
    # The server writes beside the rule log (the rule log is this job's own).
    server_log = Path(log_file or outputs["responses"]).with_suffix(".server.log")
    return run(
        dataset=dataset,
        loaded=loaded,
        backend=lambda: make_backend(settings, dataset, info, server_log),
        artifact=artifact,
        store=store,
        outputs=outputs,
        openai=settings.openai,
        regenerate=settings.source.regenerate,
    )


def make_backend(settings: ResponsesSettings, dataset: str, info: dict, server_log: Path) -> Backend:
    if settings.backend == "hf":
        from draftsmith.responses.hf import HFBackend

        return HFBackend(dataset, info["hf_dir"], info, settings.sampling, settings.hf)
    if settings.backend == "openai":
        from draftsmith.responses.openai_api import OpenAIBackend

        served = settings.openai.model or info["hf_dir"]
        return OpenAIBackend(dataset, settings.openai, settings.sampling, served_model=served)
    from draftsmith.responses.sglang import SGLangBackend

    return SGLangBackend(
        dataset, info["hf_dir"], settings.sglang, settings.openai, settings.sampling, server_log
    )


class Backend(Protocol):
    """A backend that is also a context manager (`sglang`: a server) is entered once per job
    and serves every round of requests."""

    def generate(self, prompts: list[Prompt], emit: Callable[[dict], None], spent: Usage) -> None:
        """Generate a record for each prompt and pass it to `emit` as soon as it is done.

        `spent` is the usage of the dataset's answers already stored (for budget caps);
        backends may raise `BudgetReached` to stop cleanly.
        """


def run(
    *,
    dataset: str,
    loaded: LoadedDataset,
    backend: Callable[[], Backend],
    artifact: Artifact,
    store: answers.AnswerStore,
    outputs: dict,
    openai: OpenAIGeneration,
    regenerate: str = "last",
) -> dict:
    """Generate what the answer `store` (held) lacks, then write `outputs` (responses,
    bad_rows, manifest). `backend` makes the backend, only when there is something to ask;
    `openai`'s prices cost the answers.
    `regenerate` "last": one answer per prompt; "every_turn": every assistant turn of each
    conversation (`responses.turns`), one record per turn."""
    started = time.time()
    if store.torn_lines:
        log.warning("answer store: dropped %d torn line(s) from an interrupted run", store.torn_lines)
    with _Asker(dataset, store, backend) as asker:
        if regenerate == "every_turn":
            records, turn_stats = _every_turn(loaded, asker)
        else:
            records, turn_stats = _last_turn(loaded, asker), {}
    usage = Usage()
    for record in records:
        usage.add(record_usage(record))
    atomic.write_jsonl(outputs["responses"], records)
    atomic.write_jsonl(outputs["bad_rows"], [b.as_dict() for b in loaded.bad_rows])
    stats = {
        "rows": loaded.total_rows,
        "samples": len(records),
        "bad_rows": len(loaded.bad_rows),
        "skipped_over_cap": loaded.skipped_over_cap,
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "cost_usd": round(openai.cost_usd(usage), 6),
        "finish_reasons": _count(r["finish_reason"] for r in records),
        "with_token_ids": sum(r["response_token_ids"] is not None for r in records),
        "with_reasoning": sum(bool(r["reasoning"]) for r in records),
        "with_tool_calls": sum(bool(r.get("tool_calls")) for r in records),
        # Answers requested from the backend by this job, and those found in the answer store.
        "answers_generated": asker.generated,
        "answers_reused": len(records) - asker.generated,
        **turn_stats,
    }
    manifest.write(artifact, outputs["manifest"], [outputs["responses"], outputs["bad_rows"]], stats, started)
    return stats


class _Asker:
    """Asks the backend (made on first need) for the prompts the store lacks, each distinct
    prompt once, and stores each answer as it completes."""

    def __init__(self, dataset: str, store: answers.AnswerStore, backend: Callable[[], Backend]) -> None:
        self.dataset, self.store, self._make = dataset, store, backend
        self._backend: Backend | None = None
        self._held = contextlib.ExitStack()
        self.generated = 0

    def __enter__(self) -> _Asker:
        return self

    def __exit__(self, *exc: object) -> None:
        self._held.close()

    def ask(self, prompts: list[Prompt], known: list[dict]) -> None:
        """`known`: the records already answered (their usage counts against a budget)."""
        addresses = {p.id: answers.address(p.messages, p.tools) for p in prompts}
        pending = list({addresses[p.id]: p for p in prompts if addresses[p.id] not in self.store}.values())
        log.info(
            "%s: %d prompts, %d already answered in the store, %d to generate",
            self.dataset,
            len(prompts),
            sum(addresses[p.id] in self.store for p in prompts),
            len(pending),
        )
        if not pending:  # nothing to ask: no model loaded, no server started
            return
        spent = Usage()
        for record in known:
            spent.add(record_usage(record))
        bar, rate = progress(len(pending), f"generate {self.dataset}"), TokenRate()

        def emit(record: dict) -> None:
            # Stored under the address of the prompt as read, whatever the backend echoes.
            self.store.put(record, addresses[record["id"]])
            self.generated += 1
            bar.update(1)
            bar.set_postfix_str(rate.add(record["usage"]["completion_tokens"]), refresh=False)

        if self._backend is None:
            self._backend = self._make()
            if isinstance(self._backend, contextlib.AbstractContextManager):  # a server: one per job
                self._backend = self._held.enter_context(self._backend)
        try:
            self._backend.generate(pending, emit, spent)
        finally:
            bar.close()


def _last_turn(loaded: LoadedDataset, asker: _Asker) -> list[dict]:
    """One answer per prompt: the reply after its last user or tool turn."""
    at = {p.id: answers.address(p.messages, p.tools) for p in loaded.prompts}

    def record(p: Prompt) -> dict:
        return answers.as_record(asker.store.get(at[p.id]), p.id, asker.dataset, p.index)

    asker.ask(loaded.prompts, [record(p) for p in loaded.prompts if at[p.id] in asker.store])
    return [record(p) for p in loaded.prompts]


def _every_turn(loaded: LoadedDataset, asker: _Asker) -> tuple[list[dict], dict]:
    """Every conversation's turns in rounds: round n asks each unfinished conversation's
    first unanswered turn, so a turn is asked once the target's previous one is stored."""
    while True:
        walks = [turns.walk(p, asker.store, asker.dataset) for p in loaded.prompts]
        pending = [w.pending for w in walks if w.pending is not None]
        if not pending:
            break
        before = asker.generated
        asker.ask(pending, [r for w in walks for r in w.records])
        if asker.generated == before:  # a backend that stored nothing would loop forever
            raise GenerationError(f"{asker.dataset}: the backend answered none of {len(pending)} turns")
    records = [r for w in walks for r in w.records]
    return records, {
        "conversations": len(walks),
        "regenerated_turns": len(records),
        "tool_calls_matched": sum(w.calls_matched for w in walks),
        "ended_early": sum(w.ended_early for w in walks),
    }


def _count(values) -> dict[str, int]:
    counts: dict[str, int] = {}
    for value in values:
        counts[str(value)] = counts.get(str(value), 0) + 1
    return counts
