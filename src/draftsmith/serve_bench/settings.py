"""The settings the serving benchmark's job reads, resolved once by `workflow.configure`, and the
refusals of the config alone (every problem in one error): the prompt set, the algorithm, the
configured chains, the extra args and the served context against the exported one.

No torch here: config validation imports this module.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from draftsmith.config import export_serving_context, served_search_settings
from draftsmith.evaluate import PromptSetEntry
from draftsmith.export import SGLANG_ARCHITECTURE
from draftsmith.runtime.resources import serve_bench_gpus
from draftsmith.runtime.sglang import ServerLaunch
from draftsmith.serve_bench.command import (
    EAGLE3,
    SECTION,
    SGLANG_SECTION,
    ServeBenchError,
    serving_server,
)
from draftsmith.speculation import Speculation

T = TypeVar("T")


@dataclass(frozen=True)
class ServeBenchSettings:
    """What the benchmark serves (the configured chains, then the search's best when it runs),
    to which prompts, and how its servers start."""

    experiment: str
    prompt_set: PromptSetEntry  # serve_benchmark.prompt_set's entry of evaluate.prompt_sets
    system_prompt: str | None  # generation.system_prompt: prompts render as the training ones did
    trust_remote_code: bool  # model.trust_remote_code
    chains: tuple[Speculation, ...]  # one per serve_benchmark.k, each as SGLang runs it
    speculative_algorithm: str
    max_new_tokens: int
    concurrency: tuple[int, ...]
    warmup_requests: int
    server: ServerLaunch
    search_settings: int  # how many of the settings search's best it also serves (0: none)
    gpus: int  # GPUs the job holds (`runtime.resources.serve_bench_gpus`)

    @classmethod
    def of(cls, config: dict) -> ServeBenchSettings:
        """Refuses an unknown prompt set, EAGLE, a chain SGLang would run otherwise, falsifying
        extra args and a served context above the exported one, every problem in one error."""
        bench, sets = config[SECTION], config["evaluate"]["prompt_sets"]
        problems: list[str] = []

        def attempt(check: Callable[[], T]) -> T | None:
            """`check`'s value; its refusal joins the others (one error names them all)."""
            try:
                return check()
            except ServeBenchError as exc:
                problems.append(str(exc))
                return None

        attempt(lambda: _check_prompt_set(bench["prompt_set"], sets))
        attempt(lambda: _check_algorithm(bench["speculative_algorithm"]))
        chains = tuple(attempt(lambda k=k: _chain(bench, k)) for k in bench["k"])
        server = attempt(lambda: serving_server(bench["sglang"]))
        context = bench["sglang"]["context_length"]
        attempt(lambda: _check_planned_context(context, export_serving_context(config)))
        if problems:
            raise ServeBenchError("; ".join(dict.fromkeys(problems)))
        name = bench["prompt_set"]
        entry = sets[name]
        return cls(
            experiment=config["experiment"],
            prompt_set=PromptSetEntry.of(name, entry),
            system_prompt=config["generation"]["system_prompt"],
            trust_remote_code=config["model"]["trust_remote_code"],
            chains=chains,
            speculative_algorithm=bench["speculative_algorithm"],
            max_new_tokens=bench["max_new_tokens"],
            concurrency=tuple(bench["concurrency"]),
            warmup_requests=bench["warmup_requests"],
            server=server,
            search_settings=served_search_settings(config),
            gpus=serve_bench_gpus(config),
        )


def _check_prompt_set(name: str | None, prompt_sets: dict) -> None:
    if name not in prompt_sets:
        known = sorted(prompt_sets) or "none configured"
        raise ServeBenchError(
            f"{SECTION}.prompt_set: {name!r} is not a set of evaluate.prompt_sets (known: {known})"
        )


def _check_algorithm(algorithm: str) -> None:
    """Refuse EAGLE for the EAGLE-3 draft this pipeline exports."""
    if algorithm != EAGLE3:
        raise ServeBenchError(
            f"{SECTION}.speculative_algorithm: {algorithm} with an EAGLE-3 draft "
            f"({SGLANG_ARCHITECTURE}): SGLang would feed it the last layer's hidden state (H) "
            "instead of the three aux layers (3H) without an error; use EAGLE3"
        )


def _chain(bench: dict, k: int) -> Speculation:
    """The configured chain of `k`, refused unless SGLang runs it as that chain."""
    if bench["eagle_topk"] != 1:
        raise ServeBenchError(
            f"{SECTION}.eagle_topk: {bench['eagle_topk']}: the benchmark measures chains "
            "(topk 1); a tree of drafts has no single k to report"
        )
    tokens = bench["num_draft_tokens"]
    chain = Speculation.chain(k) if tokens is None else Speculation(k, 1, tokens)
    try:
        chain.check()
    except ValueError as exc:
        raise ServeBenchError(f"{SECTION}.num_draft_tokens for k={k}: {exc} (leave it null)") from None
    return chain


def _check_planned_context(served: int | None, planned: int) -> None:
    if served is not None and served > planned:
        raise ServeBenchError(
            f"{SGLANG_SECTION}.context_length ({served}) exceeds the context the draft is exported "
            f"for ({planned}, export.serving_context or train.max_position_embeddings): a draft "
            "below the serving context loses acceptance on long prompts"
        )
