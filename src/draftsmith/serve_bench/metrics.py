"""Requests to SGLang's native /generate, and what the answers say: tokens, verify steps, speed.

Payload (sglang 0.5.23, python/sglang/srt/managers/tokenizer_manager.py): one request is
answered by one object {"text", "output_ids", "meta_info"}. meta_info carries `id` (the
request's `rid`), `finish_reason`, `prompt_tokens`, `completion_tokens`, `cached_tokens`
and, once finished, `e2e_latency` (seconds, measured by the server). With speculative
decoding on, `_calculate_spec_decoding_metrics` adds `spec_verify_ct` (target verify
passes) and `spec_accept_length` = completion_tokens / spec_verify_ct (the bonus token
counted), but only when spec_verify_ct > 0: a request that ends with the token of its
prefill has none. completion_tokens includes that prefill token, so SGLang's AL (and ours,
to stay comparable) is above the mean accepted per verify step by at most 1/spec_verify_ct.

So a draft answer of more than one token without `spec_verify_ct` means the server did not
speculate; taking it as one token per step would report an AL of 1 as if measured, and is
an error. Tokens per second use the client's clock (request sent to answer read), the same
for the baseline and the draft.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import fmean

from draftsmith.serve_bench.command import ServeBenchError
from draftsmith.speculation import Speculation

_RID_SEP = "@"


@dataclass(frozen=True)
class RequestResult:
    id: str
    tokens: int
    verify_steps: int  # 0 without speculation
    seconds: float
    server_seconds: float | None
    text: str

    @property
    def acceptance_length(self) -> float | None:
        return acceptance_length(self.tokens, self.verify_steps)


@dataclass(frozen=True)
class PassResult:
    """Every prompt once at one concurrency (requests in prompt order)."""

    concurrency: int
    requests: list[RequestResult]
    wall_s: float


def request_id(prompt_id: str, tag: str) -> str:
    """A rid unique per server run (SGLang refuses a rid that is in flight) that names the prompt."""
    return f"{prompt_id}{_RID_SEP}{tag}"


def build_request(rid: str, input_ids: list[int], max_new_tokens: int) -> dict:
    """A greedy /generate request of exactly the rendered prompt's ids."""
    return {
        "rid": rid,
        "input_ids": [int(t) for t in input_ids],
        "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0.0},
    }


def parse_response(body: object, *, rid: str, k: int | None, seconds: float) -> RequestResult:
    """One /generate answer; `k` is the draft steps per verify step of the server's setting
    (a chain's k, a tree's num_steps; None: no speculation)."""
    meta = body.get("meta_info") if isinstance(body, dict) else None
    if not isinstance(meta, dict):
        raise ServeBenchError(f"/generate answer to {rid!r} has no meta_info: {_excerpt(body)}")
    where = f"/generate answer to {rid!r}"
    if meta.get("id") != rid:
        raise ServeBenchError(f"{where}: meta_info.id is {meta.get('id')!r} (answers crossed?)")
    tokens = _count(meta, "completion_tokens", where)
    text = body.get("text")
    if not isinstance(text, str):
        raise ServeBenchError(f"{where}: no text")
    latency = meta.get("e2e_latency")
    return RequestResult(
        id=rid.split(_RID_SEP, 1)[0],
        tokens=tokens,
        verify_steps=_verify_steps(meta, tokens, k, where),
        seconds=seconds,
        server_seconds=float(latency) if isinstance(latency, int | float) else None,
        text=text,
    )


def _verify_steps(meta: dict, tokens: int, k: int | None, where: str) -> int:
    if k is None:
        if meta.get("spec_verify_ct"):
            raise ServeBenchError(f"{where}: spec_verify_ct from the baseline server: it speculates")
        return 0
    if "spec_verify_ct" not in meta:
        if tokens <= 1:
            return 0  # the prefill's token only: SGLang reports no verify pass
        raise ServeBenchError(
            f"{where}: {tokens} tokens but no meta_info.spec_verify_ct: the draft server did not "
            "speculate (or this SGLang does not report it); counting one token per step would "
            "report an acceptance length of 1"
        )
    steps = _count(meta, "spec_verify_ct", where)
    # Each verify pass yields 1..k+1 tokens (k: a chain's length, a tree's depth); the
    # prefill adds one more.
    if not steps or not steps <= tokens <= steps * (k + 1) + 1:
        raise ServeBenchError(
            f"{where}: {tokens} tokens in {steps} verify steps is impossible with {k} draft steps "
            f"per verify step (a chain of k={k} or a tree {k} deep)"
        )
    return steps


def _count(meta: dict, field: str, where: str) -> int:
    value = meta.get(field)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ServeBenchError(f"{where}: meta_info.{field} is {value!r}, not a count")
    return value


def acceptance_length(tokens: int, verify_steps: int) -> float | None:
    """Tokens per target verify pass, the bonus token counted (None without verify passes)."""
    return tokens / verify_steps if verify_steps else None


def summarize(run: PassResult, *, speculative: bool) -> dict:
    """Totals of one pass. tokens_per_s: single stream, tokens over the summed request times;
    concurrent, the total throughput (tokens over the pass's wall time)."""
    requests = run.requests
    tokens = sum(r.tokens for r in requests)
    seconds = sum(r.seconds for r in requests) if run.concurrency == 1 else run.wall_s
    summary = {
        "requests": len(requests),
        "tokens": tokens,
        "seconds": round(seconds, 6),
        "tokens_per_s": _rate(tokens, seconds),
        "request_tokens_per_s": _mean_rate(requests),
        "per_request": [_request_row(r, speculative) for r in requests],
    }
    if speculative:
        steps = sum(r.verify_steps for r in requests)
        summary["verify_steps"] = steps
        summary["acceptance_length"] = _round(acceptance_length(tokens, steps))
    return summary


def _request_row(r: RequestResult, speculative: bool) -> dict:
    row = {"id": r.id, "tokens": r.tokens, "seconds": round(r.seconds, 6), "server_seconds": r.server_seconds}
    if speculative:
        row |= {"verify_steps": r.verify_steps, "acceptance_length": _round(r.acceptance_length)}
    return row


def speedup(baseline: dict, draft: dict) -> float | None:
    """Draft over baseline output tokens per second (same prompts, settings and hardware)."""
    if not baseline["tokens_per_s"] or draft["tokens_per_s"] is None:
        return None
    return round(draft["tokens_per_s"] / baseline["tokens_per_s"], 4)


def settings(baseline: dict[int, PassResult], drafts: dict[Speculation, dict[int, PassResult]]) -> list[dict]:
    """One entry per (setting, concurrency): both summaries, the speed-up, and how many outputs
    match. `k` is a chain's k (null for a tree)."""
    rows = []
    for setting, by_concurrency in drafts.items():
        for concurrency, run in by_concurrency.items():
            base = summarize(baseline[concurrency], speculative=False)
            draft = summarize(run, speculative=True)
            # Greedy speculative decoding is lossless: outputs should equal the target's own.
            draft["same_output_as_baseline"] = sum(
                b.text == d.text for b, d in zip(baseline[concurrency].requests, run.requests, strict=True)
            )
            rows.append(
                {
                    "setting": setting.label,
                    "k": setting.num_steps if setting.is_chain else None,
                    **setting.as_json(),
                    "concurrency": concurrency,
                    "baseline": base,
                    "draft": draft,
                    "speedup": speedup(base, draft),
                }
            )
    return rows


def _rate(tokens: int, seconds: float) -> float | None:
    return round(tokens / seconds, 3) if seconds > 0 else None


def _mean_rate(requests: list[RequestResult]) -> float | None:
    """The mean of each request's own tokens per second (what one user sees)."""
    rates = [r.tokens / r.seconds for r in requests if r.seconds > 0]
    return round(fmean(rates), 3) if rates else None


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def _excerpt(value: object, limit: int = 300) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def search_verdict(rows: list[dict], search: dict, served: list[str]) -> dict:
    """serve_benchmark.json's `search`: whether the search's recommended setting is the fastest
    served of the search's best settings `served` (search rank order), single stream where
    measured (else the lowest concurrency); equal speed-ups go to the better search rank."""
    concurrency = min(row["concurrency"] for row in rows)
    measured = {row["setting"]: row["speedup"] for row in rows if row["concurrency"] == concurrency}
    speedups = {name: measured[name] for name in served}
    fastest = max(served, key=lambda name: -1.0 if speedups[name] is None else speedups[name])
    recommended = search["recommended"]["setting"]
    return {
        "key": search["key"],
        "recommended": recommended,
        "served": served,
        "concurrency": concurrency,
        "speedups": speedups,
        "fastest": fastest,
        "confirmed": fastest == recommended,
    }


def markdown(report: dict) -> str:
    """The benchmark as a table, one row per (setting, concurrency)."""
    lines = [
        f"# Serving benchmark: {report['experiment']}",
        "",
        f"SGLang, key `{report['key']}`, prompt set `{report['prompt_set']}` ({report['prompts']} "
        f"prompts), max_new_tokens {report['max_new_tokens']}, greedy. Single stream: tokens over "
        "the summed request times; concurrency > 1: total throughput over the wall time. "
        "AL = tokens / target verify steps (bonus token counted).",
        "",
        "| setting | concurrency | baseline tok/s | draft tok/s | speed-up | AL | same output as baseline |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in report["settings"]:
        base, draft = s["baseline"], s["draft"]
        lines.append(
            f"| {s['setting']} | {s['concurrency']} | {_cell(base['tokens_per_s'])} | "
            f"{_cell(draft['tokens_per_s'])} | {_cell(s['speedup'], 'x')} | "
            f"{_cell(draft['acceptance_length'])} | {draft['same_output_as_baseline']}/{draft['requests']} |"
        )
    verdict = report.get("search")
    return "\n".join(lines) + "\n" + (_verdict_markdown(verdict) if verdict else "")


def _verdict_markdown(verdict: dict) -> str:
    speedups = ", ".join(f"{name} {_cell(x, 'x')}" for name, x in verdict["speedups"].items())
    outcome = (
        "confirmed: it is the fastest served"
        if verdict["confirmed"]
        else f"not confirmed: {verdict['fastest']} is faster served"
    )
    return (
        f"\nSettings search `{verdict['key']}`: its best {len(verdict['served'])} settings served at "
        f"concurrency {verdict['concurrency']} ({speedups}); its recommendation {verdict['recommended']} "
        f"is {outcome}.\n"
    )


def _cell(value: float | None, unit: str = "") -> str:
    return "n/a" if value is None else f"{value:.2f}{unit}"
