"""Run the serving benchmark: one SGLang server per setting, torn down before the next starts.

The baseline server (the plain target) runs once; its passes are the reference for every
draft setting: each configured chain of k, then the settings search's best
`search.confirm_top` settings (chains or trees) not among them, when the search ran; the
report then says whether the search's recommendation is the fastest of those served.
Each server: wait for /health, warm up, then one pass over the prompt set per
configured concurrency, the prefix cache flushed before each pass so every pass starts
alike. Every server runs in a `ManagedServer`: its process group is gone when the `with`
block ends, normally, on an error, or on SIGTERM/SIGINT (`Interrupted`), and the
process guard kills it when the job is killed outright.

Verified here, without a GPU: commands, refusals, payload parsing, the arithmetic, and
server lifetimes against a stand-in. Not verified: a real SGLang run.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import cycle, islice
from pathlib import Path

import httpx

from draftsmith.formats.prompt_sets import training_prompts
from draftsmith.fsutil import atomic
from draftsmith.runtime.gpus import acquire_gpus
from draftsmith.runtime.jobs import optional_input
from draftsmith.runtime.process import ManagedServer, free_port, redact
from draftsmith.search import top_settings
from draftsmith.serve_bench import metrics
from draftsmith.serve_bench.command import (
    HOST,
    SECTION,
    ServeBenchError,
    check_draft,
    check_environment,
    draft_command,
    launch_command,
    serving_context,
)
from draftsmith.serve_bench.settings import ServeBenchSettings
from draftsmith.speculation import BASELINE, Speculation
from draftsmith.store import manifest
from draftsmith.store.plan import Artifact
from draftsmith.target.load import model_info, read_target_config

log = logging.getLogger(__name__)

LOGS_DIR = "logs"


@dataclass(frozen=True)
class BenchPrompt:
    id: str
    input_ids: list[int]


def draft_settings(bench: ServeBenchSettings, searched: Sequence[Speculation] = ()) -> list[Speculation]:
    """The draft servers' settings: each configured chain, then each of the search's
    `searched` settings (read from search.json, so checked here) not among them."""
    chains = list(bench.chains)
    for setting in searched:
        try:
            setting.check()
        except ValueError as exc:
            raise ServeBenchError(f"settings search's {setting}: {exc}") from None
    return chains + [setting for setting in dict.fromkeys(searched) if setting not in chains]


def build_commands(
    model_dir: str,
    draft_dir: Path,
    bench: ServeBenchSettings,
    port: int,
    searched: Sequence[Speculation] = (),
) -> dict[str, list[str]]:
    """Every launch of the benchmark, built before any server starts."""
    commands = {BASELINE: launch_command(model_dir, bench.server, port)}
    for setting in draft_settings(bench, searched):
        commands[setting.label] = draft_command(
            model_dir, bench.server, port, draft_dir, setting, bench.speculative_algorithm
        )
    return commands


def run_benchmark(
    model_dir: str,
    draft_dir: Path,
    prompts: list[BenchPrompt],
    bench: ServeBenchSettings,
    logs_dir: Path,
    port: int,
    searched: Sequence[Speculation] = (),
) -> dict:
    """Baseline, then each draft setting; returns the settings and the (redacted) commands."""
    commands = build_commands(model_dir, draft_dir, bench, port, searched)
    url = f"http://{HOST}:{port}"

    def run(setting: Speculation | None) -> dict[int, metrics.PassResult]:
        label, slug = (setting.label, setting.slug) if setting else (BASELINE, BASELINE)
        log_path = logs_dir / f"{slug}.log"
        return run_server(commands[label], url, prompts, bench, setting=setting, log_path=log_path)

    baseline = run(None)
    drafts = {setting: run(setting) for setting in draft_settings(bench, searched)}
    return {
        "settings": metrics.settings(baseline, drafts),
        "command": {name: redact(cmd) for name, cmd in commands.items()},
    }


def run_server(
    cmd: list[str],
    url: str,
    prompts: list[BenchPrompt],
    bench: ServeBenchSettings,
    *,
    setting: Speculation | None,
    log_path: Path,
) -> dict[int, metrics.PassResult]:
    """Start one server (`setting` None: the target alone), run every concurrency against it,
    tear its process group down."""
    name = f"sglang {setting.label if setting else BASELINE} server"
    startup = bench.server.startup_timeout_s
    server = ManagedServer(cmd, f"{url}/health", log_path=log_path, startup_timeout_s=startup, name=name)
    runs: dict[int, metrics.PassResult] = {}
    depth = setting.num_steps if setting else None
    with server, _client(bench.server.request_timeout_s) as client:
        requester = _Requester(client, url, bench.max_new_tokens, depth, f"{name} (log: {log_path})")
        if bench.warmup_requests:
            requester.run_pass(list(islice(cycle(prompts), bench.warmup_requests)), 1, "warmup")
        for concurrency in bench.concurrency:
            runs[concurrency] = requester.run_pass(prompts, concurrency, f"c{concurrency}")
            log.info("%s: %s", name, _pass_line(runs[concurrency], depth))
    return runs


def _client(request_timeout_s: float) -> httpx.Client:
    # trust_env=False: a proxy from the environment must not see loopback traffic.
    return httpx.Client(timeout=httpx.Timeout(request_timeout_s, connect=10.0), trust_env=False)


@dataclass(frozen=True)
class _Requester:
    """Requests to one server: one pass is every prompt once, `concurrency` in flight."""

    client: httpx.Client
    url: str
    max_new_tokens: int
    k: int | None  # draft steps per verify step of the server's setting; None for the baseline
    where: str  # names the server and its log in errors

    def run_pass(self, prompts: list[BenchPrompt], concurrency: int, tag: str) -> metrics.PassResult:
        self._post("/flush_cache", None)
        pool = ThreadPoolExecutor(max_workers=concurrency)
        started = time.perf_counter()
        try:
            requests = list(pool.map(lambda p: self._generate(p, tag), prompts))
        except BaseException:
            # Do not wait for requests in flight: tearing the server down ends them.
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        pool.shutdown()
        return metrics.PassResult(concurrency, requests, time.perf_counter() - started)

    def _generate(self, prompt: BenchPrompt, tag: str) -> metrics.RequestResult:
        rid = metrics.request_id(prompt.id, tag)
        request = metrics.build_request(rid, prompt.input_ids, self.max_new_tokens)
        started = time.perf_counter()
        response = self._post("/generate", request)
        seconds = time.perf_counter() - started
        return metrics.parse_response(_json(response, self.where), rid=rid, k=self.k, seconds=seconds)

    def _post(self, path: str, body: dict | None) -> httpx.Response:
        try:
            response = self.client.post(f"{self.url}{path}", json=body)
        except httpx.HTTPError as exc:
            raise ServeBenchError(f"{self.where}: {path} failed: {type(exc).__name__}: {exc}") from None
        if response.status_code != 200:
            raise ServeBenchError(
                f"{self.where}: {path} answered {response.status_code}: {response.text[:500]}"
            )
        return response


def _json(response: httpx.Response, where: str) -> object:
    try:
        return response.json()
    except ValueError:
        raise ServeBenchError(f"{where}: /generate answered no JSON: {response.text[:300]}") from None


def _pass_line(run: metrics.PassResult, k: int | None) -> str:
    summary = metrics.summarize(run, speculative=k is not None)
    al = f", AL {summary['acceptance_length']}" if k is not None else ""
    return f"concurrency {run.concurrency}: {summary['tokens']} tokens, {summary['tokens_per_s']} tok/s{al}"


# --- the stage ---------------------------------------------------------------------------
def load_prompts(
    bench: ServeBenchSettings, hf_dir: str, context: int, training: dict[str, str], planned_sha256: str
) -> list[BenchPrompt]:
    """The configured prompt set (its file's content hash `planned_sha256`), rendered as the
    evaluator renders it, each checked to fit the serving `context` and checked against the
    training prompts (`training`: prompt hash -> sample id), since a prompt the draft was
    trained on inflates its acceptance length."""
    from draftsmith.formats.prompt_sets import check_overlap, load_prompt_set
    from draftsmith.target import load as target

    entry = bench.prompt_set
    tokenizer = target.load_tokenizer(hf_dir, bench.trust_remote_code)
    rendered = load_prompt_set(entry.name, entry.as_entry(), tokenizer, bench.system_prompt, planned_sha256)
    check_overlap({entry.name: rendered}, training)
    for prompt in rendered:
        if len(prompt.input_ids) + bench.max_new_tokens > context:
            raise ServeBenchError(
                f"prompt {prompt.id} of evaluate.prompt_sets.{entry.name}: {len(prompt.input_ids)} tokens + "
                f"{SECTION}.max_new_tokens {bench.max_new_tokens} exceed the serving context {context}"
            )
    return [BenchPrompt(p.id, [int(t) for t in p.input_ids]) for p in rendered]


def serve_bench(
    settings: ServeBenchSettings, artifact: Artifact, inputs: dict, outputs: dict, log_file: str | None = None
) -> dict:
    """Rule `serve_bench`: baseline and draft servers for each k (and the settings search's
    best settings when it ran), the report and manifest."""

    started = time.time()
    check_environment(os.environ)
    hf_dir = model_info(inputs["model"])["hf_dir"]
    draft_dir = Path(inputs["draft_config"]).parent
    context = serving_context(settings.server, read_target_config(hf_dir))
    check_draft(draft_dir, context)
    training = training_prompts(inputs["merged"], inputs["responses"])
    prompts = load_prompts(settings, hf_dir, context, training, artifact.params["prompts"]["source"])
    search_path = optional_input(inputs.get("search"))
    search = json.loads(Path(search_path).read_text()) if search_path else None
    searched = top_settings(search, settings.search_settings) if search else []
    logs_dir = Path(outputs["json"]).parent / LOGS_DIR
    shutil.rmtree(logs_dir, ignore_errors=True)  # server logs of an earlier, failed attempt
    with acquire_gpus(settings.gpus):
        port = settings.server.port or free_port()
        result = run_benchmark(hf_dir, draft_dir, prompts, settings, logs_dir, port, searched)
    if searched:
        served = [setting.label for setting in searched]
        result["search"] = metrics.search_verdict(result["settings"], search, served)
    report = {
        "key": artifact.key,
        "experiment": settings.experiment,
        "prompt_set": settings.prompt_set.name,
        "prompts": len(prompts),
        "max_new_tokens": settings.max_new_tokens,
        "serving_context": context,
        **result,
    }
    atomic.write_json(outputs["json"], report)
    atomic.write_text(outputs["md"], metrics.markdown(report))
    speedups = [s["speedup"] for s in report["settings"] if s["speedup"] is not None]
    stats = {"settings": len(report["settings"]), "best_speedup": max(speedups, default=None)}
    manifest.write(artifact, outputs["manifest"], [outputs["json"], outputs["md"], logs_dir], stats, started)
    return report
