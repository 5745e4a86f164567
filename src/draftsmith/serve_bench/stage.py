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

from draftsmith.config import served_search_settings
from draftsmith.formats.prompt_sets import training_prompts
from draftsmith.fsutil import atomic
from draftsmith.runtime.gpus import acquire_gpus
from draftsmith.runtime.jobs import optional_input
from draftsmith.runtime.process import ManagedServer, free_port, redact
from draftsmith.runtime.resources import serve_bench_gpus
from draftsmith.search import top_settings
from draftsmith.serve_bench import metrics
from draftsmith.serve_bench.command import (
    HOST,
    SECTION,
    ServeBenchError,
    check_config,
    check_draft,
    check_environment,
    configured_chain,
    draft_command,
    launch_command,
    serving_context,
)
from draftsmith.speculation import BASELINE, Speculation
from draftsmith.store import manifest
from draftsmith.store.plan import plan_for
from draftsmith.target.load import model_info, read_target_config

log = logging.getLogger(__name__)

LOGS_DIR = "logs"


@dataclass(frozen=True)
class BenchPrompt:
    id: str
    input_ids: list[int]


def draft_settings(bench_cfg: dict, searched: Sequence[Speculation] = ()) -> list[Speculation]:
    """The draft servers' settings: each configured chain (refused unless SGLang runs it as
    that chain), then each of the search's `searched` settings not among them."""
    chains = [configured_chain(bench_cfg, k) for k in bench_cfg["k"]]
    for setting in searched:
        try:
            setting.check()
        except ValueError as exc:
            raise ServeBenchError(f"settings search's {setting}: {exc}") from None
    return chains + [setting for setting in dict.fromkeys(searched) if setting not in chains]


def build_commands(
    model_dir: str, draft_dir: Path, bench_cfg: dict, port: int, searched: Sequence[Speculation] = ()
) -> dict[str, list[str]]:
    """Every launch of the benchmark, built (and so checked) before any server starts."""
    commands = {BASELINE: launch_command(model_dir, bench_cfg, port)}
    for setting in draft_settings(bench_cfg, searched):
        commands[setting.label] = draft_command(model_dir, bench_cfg, port, draft_dir, setting)
    return commands


def run_benchmark(
    model_dir: str,
    draft_dir: Path,
    prompts: list[BenchPrompt],
    bench_cfg: dict,
    logs_dir: Path,
    port: int,
    searched: Sequence[Speculation] = (),
) -> dict:
    """Baseline, then each draft setting; returns the settings and the (redacted) commands."""
    commands = build_commands(model_dir, draft_dir, bench_cfg, port, searched)
    url = f"http://{HOST}:{port}"

    def run(setting: Speculation | None) -> dict[int, metrics.PassResult]:
        label, slug = (setting.label, setting.slug) if setting else (BASELINE, BASELINE)
        log_path = logs_dir / f"{slug}.log"
        return run_server(commands[label], url, prompts, bench_cfg, setting=setting, log_path=log_path)

    baseline = run(None)
    drafts = {setting: run(setting) for setting in draft_settings(bench_cfg, searched)}
    return {
        "settings": metrics.settings(baseline, drafts),
        "command": {name: redact(cmd) for name, cmd in commands.items()},
    }


def run_server(
    cmd: list[str],
    url: str,
    prompts: list[BenchPrompt],
    bench_cfg: dict,
    *,
    setting: Speculation | None,
    log_path: Path,
) -> dict[int, metrics.PassResult]:
    """Start one server (`setting` None: the target alone), run every concurrency against it,
    tear its process group down."""
    sglang = bench_cfg["sglang"]
    name = f"sglang {setting.label if setting else BASELINE} server"
    server = ManagedServer(
        cmd, f"{url}/health", log_path=log_path, startup_timeout_s=sglang["startup_timeout_s"], name=name
    )
    runs: dict[int, metrics.PassResult] = {}
    depth = setting.num_steps if setting else None
    with server, _client(sglang["request_timeout_s"]) as client:
        requester = _Requester(client, url, bench_cfg["max_new_tokens"], depth, f"{name} (log: {log_path})")
        if bench_cfg["warmup_requests"]:
            requester.run_pass(list(islice(cycle(prompts), bench_cfg["warmup_requests"])), 1, "warmup")
        for concurrency in bench_cfg["concurrency"]:
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
    config: dict, hf_dir: str, context: int, training: dict[str, str], planned_sha256: str
) -> list[BenchPrompt]:
    """The configured prompt set (its file's content hash `planned_sha256`), rendered as the
    evaluator renders it, each checked to fit
    and checked against the training prompts (`training`: prompt hash -> sample id), since
    a prompt the draft was trained on inflates its acceptance length."""
    from draftsmith.formats.prompt_sets import check_overlap, load_prompt_set
    from draftsmith.target import load as target

    bench = config[SECTION]
    name = bench["prompt_set"]
    tokenizer = target.load_tokenizer(hf_dir, config["model"]["trust_remote_code"])
    rendered = load_prompt_set(
        name,
        config["evaluate"]["prompt_sets"][name],
        tokenizer,
        config["generation"]["system_prompt"],
        planned_sha256,
    )
    check_overlap({name: rendered}, training)
    for prompt in rendered:
        if len(prompt.input_ids) + bench["max_new_tokens"] > context:
            raise ServeBenchError(
                f"prompt {prompt.id} of evaluate.prompt_sets.{name}: {len(prompt.input_ids)} tokens + "
                f"{SECTION}.max_new_tokens {bench['max_new_tokens']} exceed the serving context {context}"
            )
    return [BenchPrompt(p.id, [int(t) for t in p.input_ids]) for p in rendered]


def serve_bench(config: dict, inputs: dict, outputs: dict, log_file: str | None = None) -> dict:
    """Rule `serve_bench`: baseline and draft servers for each k (and the settings search's
    best settings when it ran), the report and manifest."""

    started = time.time()
    bench = config[SECTION]
    check_config(config)  # validation checks it only when enabled; the rule can be asked for anyway
    check_environment(os.environ)
    hf_dir = model_info(inputs["model"])["hf_dir"]
    draft_dir = Path(inputs["draft_config"]).parent
    context = serving_context(bench, read_target_config(hf_dir))
    check_draft(draft_dir, bench, context)
    artifact = plan_for(config).serve_bench
    training = training_prompts(inputs["merged"], inputs["responses"])
    prompts = load_prompts(config, hf_dir, context, training, artifact.params["prompts"]["source"])
    search_path = optional_input(inputs.get("search"))
    search = json.loads(Path(search_path).read_text()) if search_path else None
    searched = top_settings(search, served_search_settings(config)) if search else []
    logs_dir = Path(outputs["json"]).parent / LOGS_DIR
    shutil.rmtree(logs_dir, ignore_errors=True)  # server logs of an earlier, failed attempt
    with acquire_gpus(serve_bench_gpus(config)):
        port = bench["sglang"]["port"] or free_port()
        result = run_benchmark(hf_dir, draft_dir, prompts, bench, logs_dir, port, searched)
    if searched:
        served = [setting.label for setting in searched]
        result["search"] = metrics.search_verdict(result["settings"], search, served)
    report = {
        "key": artifact.key,
        "experiment": config["experiment"],
        "prompt_set": bench["prompt_set"],
        "prompts": len(prompts),
        "max_new_tokens": bench["max_new_tokens"],
        "serving_context": context,
        **result,
    }
    atomic.write_json(outputs["json"], report)
    atomic.write_text(outputs["md"], metrics.markdown(report))
    speedups = [s["speedup"] for s in report["settings"] if s["speedup"] is not None]
    stats = {"settings": len(report["settings"]), "best_speedup": max(speedups, default=None)}
    manifest.write(artifact, outputs["manifest"], [outputs["json"], outputs["md"], logs_dir], stats, started)
    return report
