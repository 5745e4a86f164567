"""Rule `evaluate`: held-out prompts decoded by the target alone and with the exported draft.

Per prompt set and chain length k: acceptance length (AL), per-position acceptance,
tokens/s with and without the draft and the speed-up, every speculative output checked
token for token against the target's own greedy output. Outputs: `benchmark.json`
(schema below, read by the plotting code), `benchmark.md`, `per_prompt.jsonl` (baseline
rows carry k = 0 and no verify steps) and `manifest.json`.

benchmark.json: {key, device, dtype, max_new_tokens, k, wall_s, lossless, prompt_sets:
{name: {prompts, baseline: {tokens, seconds, tokens_per_s}, by_k: {"<k>":
{acceptance_length, acceptance_rate, per_position, verify_steps, tokens, seconds,
tokens_per_s, speedup}}}}}. Tokens count every generated token; AL counts the tokens
of verify steps (see spec_decode), so AL = 1 + sum(per_position) holds exactly.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from draftsmith.errors import DraftsmithError
from draftsmith.export import AUX_LAYER_CONVENTION, SGLANG, load_sglang_export
from draftsmith.formats.markdown import coverage_sentence
from draftsmith.formats.prompt_sets import EvalPrompt, check_overlap, load_prompt_set, training_prompts
from draftsmith.runtime import gpus, jobs
from draftsmith.runtime.resources import evaluate_gpus
from draftsmith.store import atomic, manifest
from draftsmith.store.plan import EXPORT_FILES, plan_for
from draftsmith.target import load as target

if TYPE_CHECKING:
    from draftsmith.draft.model import Eagle3Draft
    from draftsmith.evaluate.spec_decode import AcceptFn, Decoded
    from draftsmith.target.layers import AuxLayers

log = logging.getLogger(__name__)


class EvaluationError(DraftsmithError):
    """The evaluation cannot run or its results do not add up."""


class LosslessError(EvaluationError):
    """Speculative decoding produced other tokens than the target's own greedy decoding."""


@dataclass(frozen=True)
class Settings:
    k: list[int]
    max_new_tokens: int
    stops: list[int]
    warmup_prompts: int


def device_name(device) -> str:
    import torch

    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({os.cpu_count()} cores, {torch.get_num_threads()} threads)"


def export_aux_layers(export_dir: Path, num_layers: int) -> AuxLayers:
    """The aux layers the exported draft was trained on, read as SGLang reads them and
    cross-checked with the export's own record of all three conventions."""
    from draftsmith.target.layers import AuxLayers

    config = json.loads((export_dir / EXPORT_FILES["config"]).read_text())
    record = json.loads((export_dir / EXPORT_FILES["record"]).read_text())["aux_layers"]
    ids = config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    aux = AuxLayers.from_convention(AUX_LAYER_CONVENTION[SGLANG], ids, num_layers)
    if aux != AuxLayers.from_manifest(record):
        raise EvaluationError(
            f"{export_dir}: config eagle_aux_hidden_state_layer_ids {ids} "
            f"({AUX_LAYER_CONVENTION[SGLANG]}) disagree with the export record {record}"
        )
    return aux


# --- measuring ------------------------------------------------------------------------
def check_lossless(
    model, set_name: str, prompt: EvalPrompt, k: int, expected: list[int], got: list[int]
) -> None:
    """Raise LosslessError at the first position where `got` leaves the greedy output."""
    if got == expected:
        return
    from draftsmith.evaluate.spec_decode import top2_margin

    at = next((i for i, (a, b) in enumerate(zip(expected, got, strict=False)) if a != b), None)
    at = min(len(expected), len(got)) if at is None else at
    want = expected[at] if at < len(expected) else "end of output"
    have = got[at] if at < len(got) else "end of output"
    margin = top2_margin(model, prompt.input_ids + expected[:at])
    raise LosslessError(
        f"prompt set {set_name!r} prompt {prompt.id}, k={k}: speculative output differs from the "
        f"target's greedy output at generated position {at}: greedy {want}, speculative {have} "
        f"(target top-2 logit margin there: {margin:.3g}; a margin near 0 is a numerical near-tie, "
        "evaluate in float32)"
    )


def _acceptance(runs: list[Decoded], k: int) -> dict:
    """AL and per-position acceptance over the verify steps of `runs`."""
    reach = [r for run in runs for r in run.reach]
    steps = len(reach)
    if not steps:
        raise EvaluationError("no verify step: every prompt ended at its first token (raise max_new_tokens)")
    per_position = [sum(r >= i for r in reach) / steps for i in range(1, k + 1)]
    length = sum(len(run.tokens) - 1 for run in runs) / steps  # the first token is the prefill's
    if not math.isclose(length, 1 + sum(per_position), rel_tol=1e-9):
        raise EvaluationError(f"AL {length} != 1 + sum(per-position acceptance) {1 + sum(per_position)}")
    return {
        "acceptance_length": length,
        "acceptance_rate": (length - 1) / k,
        "per_position": per_position,
        "verify_steps": steps,
    }


def vocab_coverage(draft: Eagle3Draft, runs: list[Decoded]) -> float:
    """The share of the target's own output tokens after the first (the ones a proposal
    could match) that lie in the draft vocabulary: a ceiling on acceptance at every
    position, and the sign of a draft vocabulary too small for the prompts."""
    import torch

    tokens = [t for run in runs for t in run.tokens[1:]]
    if not tokens:
        raise EvaluationError("no output token after the first: raise evaluate.max_new_tokens")
    return float(draft.t2d.cpu()[torch.tensor(tokens)].float().mean())


def _throughput(runs: list[Decoded]) -> dict:
    tokens = sum(len(run.tokens) for run in runs)
    seconds = sum(run.seconds for run in runs)
    return {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds}


def _row(set_name: str, prompt: EvalPrompt, k: int, run: Decoded) -> dict:
    steps = run.verify_steps if k else None
    return {
        "prompt_set": set_name,
        "id": prompt.id,
        "k": k,
        "tokens": len(run.tokens),
        "verify_steps": steps,
        "acceptance_length": (len(run.tokens) - 1) / steps if steps else None,
        "seconds": run.seconds,
    }


def benchmark_sets(
    model,
    draft: Eagle3Draft,
    aux: AuxLayers,
    prompt_sets: dict[str, list[EvalPrompt]],
    settings: Settings,
    accept: AcceptFn | None = None,
) -> tuple[dict, list[dict]]:
    """Warm up, then decode every prompt greedily and with each k; returns the
    `prompt_sets` section of benchmark.json and the per-prompt rows. `accept` replaces
    the acceptance rule (tests use it to break verification on purpose)."""
    from draftsmith.evaluate import spec_decode as sd

    accept = accept or sd.longest_agreeing_prefix
    device = model.device
    n = settings.max_new_tokens

    def base(p: EvalPrompt) -> Decoded:
        return sd.timed(device, lambda: sd.greedy(model, p.input_ids, n, settings.stops))

    def spec(p: EvalPrompt, k: int) -> Decoded:
        return sd.timed(
            device, lambda: sd.speculative(model, draft, aux, p.input_ids, k, n, settings.stops, accept)
        )

    for prompt in [p for prompts in prompt_sets.values() for p in prompts][: settings.warmup_prompts]:
        base(prompt)
        for k in settings.k:
            spec(prompt, k)
    results, rows = {}, []
    bar = jobs.progress(sum(map(len, prompt_sets.values())), "evaluate", unit="prompt")
    for name, prompts in prompt_sets.items():
        baseline, by_k = [], {k: [] for k in settings.k}
        for prompt in prompts:
            baseline.append(base(prompt))
            rows.append(_row(name, prompt, 0, baseline[-1]))
            for k in settings.k:
                by_k[k].append(spec(prompt, k))
                check_lossless(model, name, prompt, k, baseline[-1].tokens, by_k[k][-1].tokens)
                rows.append(_row(name, prompt, k, by_k[k][-1]))
            bar.update()
        results[name] = {**_summary(baseline, by_k), "draft_vocab_coverage": vocab_coverage(draft, baseline)}
        log.info("%s: %s", name, json.dumps(results[name]))
    bar.close()
    return results, rows


def _summary(baseline: list[Decoded], by_k: dict[int, list[Decoded]]) -> dict:
    base = _throughput(baseline)
    summary = {"prompts": len(baseline), "baseline": base, "by_k": {}}
    for k, runs in by_k.items():
        speed = _throughput(runs)
        speed["speedup"] = speed["tokens_per_s"] / base["tokens_per_s"]
        summary["by_k"][str(k)] = {**_acceptance(runs, k), **speed}
    return summary


# --- reporting ------------------------------------------------------------------------
def markdown(benchmark: dict) -> str:
    lines = [
        f"# Draft evaluation `{benchmark['key']}`",
        "",
        f"Chain speculative decoding, greedy, checked lossless. Device: {benchmark['device']}, "
        f"dtype {benchmark['dtype']}, max_new_tokens {benchmark['max_new_tokens']}, "
        f"wall {benchmark['wall_s']:.1f} s.",
    ]
    for name, result in benchmark["prompt_sets"].items():
        base = result["baseline"]
        lines += [
            "",
            f"## {name} ({result['prompts']} prompts)",
            "",
            f"Baseline (target alone): {base['tokens']} tokens in {base['seconds']:.2f} s. "
            f"{coverage_sentence(result['draft_vocab_coverage'])}",
            "",
            "| k | AL | acceptance rate | per-position acceptance | tok/s draft | tok/s baseline "
            "| speed-up |",
            "|---|---|---|---|---|---|---|",
        ]
        for k, r in result["by_k"].items():
            positions = " ".join(f"{p:.2f}" for p in r["per_position"])
            lines.append(
                f"| {k} | {r['acceptance_length']:.3f} | {r['acceptance_rate']:.3f} | {positions} | "
                f"{r['tokens_per_s']:.1f} | {base['tokens_per_s']:.1f} | {r['speedup']:.2f}x |"
            )
    return "\n".join(lines) + "\n"


# --- the stage ------------------------------------------------------------------------
def _load_models(config: dict, model_info: dict, export_dir: Path):
    import torch

    ev = config["evaluate"]
    # Verifying k+1 tokens at once must pick the argmax one-at-a-time decoding picks:
    # TF32 matmuls would turn near-ties into false lossless failures.
    torch.set_float32_matmul_precision("highest")
    torch.backends.cudnn.allow_tf32 = False
    model = target.load_model(
        model_info["hf_dir"], ev["dtype"], ev["device"], config["model"]["trust_remote_code"]
    )
    embed = model.get_input_embeddings().weight
    draft = load_sglang_export(export_dir, embed, compute_dtype=ev["dtype"]).to(model.device).eval()
    return model, draft, export_aux_layers(export_dir, model_info["num_hidden_layers"])


def evaluate(config: dict, inputs: dict, outputs: dict, log_file: str | None = None) -> dict:
    """Rule `evaluate`: benchmark the exported SGLang draft on the held-out prompt sets."""
    from draftsmith.target.special_tokens import stop_ids

    started = time.time()
    artifact = plan_for(config).evaluate
    ev = config["evaluate"]
    if not ev["prompt_sets"]:
        raise EvaluationError("evaluate.prompt_sets is empty: configure at least one held-out prompt set")
    model_info = target.model_info(inputs["model"])
    tokenizer = target.load_tokenizer(model_info["hf_dir"], config["model"]["trust_remote_code"])
    system_prompt = config["generation"]["system_prompt"]
    sets = {
        name: load_prompt_set(name, entry, tokenizer, system_prompt)
        for name, entry in sorted(ev["prompt_sets"].items())
    }
    check_overlap(sets, training_prompts(inputs["merged"], inputs["responses"]))
    settings = Settings(list(ev["k"]), ev["max_new_tokens"], stop_ids(model_info), ev["warmup_prompts"])
    with gpus.acquire_gpus(evaluate_gpus(config)):
        model, draft, aux = _load_models(config, model_info, Path(inputs["export_config"]).parent)
        results, rows = benchmark_sets(model, draft, aux, sets, settings)
        device = device_name(model.device)
    benchmark = {
        "key": artifact.key,
        "device": device,
        "dtype": ev["dtype"],
        "max_new_tokens": ev["max_new_tokens"],
        "k": settings.k,
        "wall_s": time.time() - started,
        "lossless": True,
        "prompt_sets": results,
    }
    write_outputs(benchmark, rows, outputs)
    stats = {
        "device": device,
        "aux_layers": aux.as_manifest(),
        "prompts": {name: len(prompts) for name, prompts in sets.items()},
    }
    files = [outputs[role] for role in ("json", "md", "per_prompt")]
    manifest.write(artifact, outputs["manifest"], files, stats, started)
    return benchmark


def write_outputs(benchmark: dict, rows: list[dict], outputs: dict) -> None:
    atomic.write_jsonl(outputs["per_prompt"], rows)
    atomic.write_json(outputs["json"], benchmark)
    atomic.write_text(outputs["md"], markdown(benchmark))
