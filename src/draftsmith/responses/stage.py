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

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from draftsmith import config as cfg
from draftsmith.formats.datasets import LoadedDataset, Prompt, load_prompts
from draftsmith.formats.responses import Usage, cost_usd, record_usage
from draftsmith.runtime import gpus
from draftsmith.runtime.jobs import TokenRate, progress
from draftsmith.runtime.resources import responses_gpus
from draftsmith.store import answers, atomic, manifest
from draftsmith.store.plan import Artifact, plan_for
from draftsmith.target.load import load_tokenizer, longest_token_chars, model_info, prompt_ids

log = logging.getLogger(__name__)


def responses(config: dict, dataset: str, inputs: dict, outputs: dict, log_file: str | None = None) -> dict:
    """Rule `responses`: the target's answer to every prompt of one dataset."""
    plan = plan_for(config)
    artifact = plan.responses[dataset]
    entry = cfg.dataset_settings(config, dataset)
    # The answer store's lock first, so a job waiting for its turn holds no GPU; GPUs are
    # leased before anything initialises CUDA and held until the last answer is written.
    with (
        answers.opened(plan.answers[dataset]) as store,
        gpus.acquire_gpus(responses_gpus(config, entry["generation"]["backend"])),
    ):
        return _responses(config, dataset, entry, artifact, store, inputs, outputs, log_file)


def _responses(
    config: dict,
    dataset: str,
    entry: dict,
    artifact: Artifact,
    store: answers.AnswerStore,
    inputs: dict,
    outputs: dict,
    log_file: str | None,
) -> dict:
    info = model_info(inputs["model"])
    tokenizer = load_tokenizer(info["hf_dir"], config["model"]["trust_remote_code"])

    def count_tokens(messages: list[dict], tools: list[dict] | None) -> int:
        return len(prompt_ids(tokenizer, messages, tools))

    loaded = load_prompts(
        dataset, entry, count_tokens, longest_token_chars(tokenizer), planned_sha256=artifact.params["source"]
    )
    # The server writes beside the rule log (the rule log is this job's own).
    server_log = Path(log_file or outputs["responses"]).with_suffix(".server.log")
    return run(
        dataset=dataset,
        loaded=loaded,
        backend=lambda: make_backend(config, dataset, entry, info, server_log),
        artifact=artifact,
        store=store,
        outputs=outputs,
        openai_cfg=config["generation"]["openai"],
    )


def make_backend(config: dict, dataset: str, entry: dict, info: dict, server_log: Path) -> Backend:
    generation = entry["generation"]
    gen_cfg = config["generation"]
    if generation["backend"] == "hf":
        from draftsmith.responses.hf import HFBackend

        return HFBackend(
            dataset, info["hf_dir"], info, generation, gen_cfg["hf"], cfg.generation_dtype(config)
        )
    if generation["backend"] == "openai":
        from draftsmith.responses.openai_api import OpenAIBackend

        served = gen_cfg["openai"]["model"] or info["hf_dir"]
        return OpenAIBackend(dataset, gen_cfg["openai"], generation, served_model=served)
    from draftsmith.responses.sglang import SGLangBackend

    return SGLangBackend(
        dataset, info["hf_dir"], gen_cfg["sglang"], gen_cfg["openai"], generation, server_log
    )


class Backend(Protocol):
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
    openai_cfg: dict,
) -> dict:
    """Generate what the answer `store` (held) lacks, then write `outputs` (responses,
    bad_rows, manifest). `backend` makes the backend, only when there is something to ask."""
    started = time.time()
    addresses = {p.id: answers.address(p.messages, p.tools) for p in loaded.prompts}
    if store.torn_lines:
        log.warning("answer store: dropped %d torn line(s) from an interrupted run", store.torn_lines)
    reused = [p for p in loaded.prompts if addresses[p.id] in store]
    # One request per distinct prompt: a prompt repeated in the dataset is asked once.
    pending = list({addresses[p.id]: p for p in loaded.prompts if addresses[p.id] not in store}.values())
    log.info(
        "%s: %d prompts, %d already answered in the store, %d to generate",
        dataset,
        len(loaded.prompts),
        len(reused),
        len(pending),
    )
    spent = Usage()
    for p in reused:
        spent.add(record_usage(store.get(addresses[p.id])))

    bar = progress(len(loaded.prompts), f"generate {dataset}", initial=len(reused))
    rate = TokenRate()

    def emit(record: dict) -> None:
        # Stored under the address of the prompt as read, whatever the backend echoes.
        store.put(record, addresses[record["id"]])
        bar.update(1)
        bar.set_postfix_str(rate.add(record["usage"]["completion_tokens"]), refresh=False)

    try:
        if pending:  # nothing to ask: no model loaded, no server started
            backend().generate(pending, emit, spent)
    finally:
        bar.close()
    records = [answers.as_record(store.get(addresses[p.id]), p.id, dataset, p.index) for p in loaded.prompts]

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
        "cost_usd": round(cost_usd(usage, openai_cfg), 6),
        "finish_reasons": _count(r["finish_reason"] for r in records),
        "with_token_ids": sum(r["response_token_ids"] is not None for r in records),
        "with_reasoning": sum(bool(r["reasoning"]) for r in records),
        # Answers requested from the backend by this job, and those found in the answer store.
        "answers_generated": len(pending),
        "answers_reused": len(reused),
    }
    manifest.write(artifact, outputs["manifest"], [outputs["responses"], outputs["bad_rows"]], stats, started)
    return stats


def _count(values) -> dict[str, int]:
    counts: dict[str, int] = {}
    for value in values:
        counts[str(value)] = counts.get(str(value), 0) + 1
    return counts
