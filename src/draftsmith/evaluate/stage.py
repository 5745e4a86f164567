"""Rule `evaluate`: held-out prompts decoded by the target alone and with the exported draft.

Per prompt set and setting (each chain length k of `evaluate.k`, each tree of
`evaluate.trees`): acceptance length (AL), acceptance per chain position or tree depth,
tokens/s with and without the draft and the speed-up, every speculative output checked
token for token against the target's own greedy output. Outputs: `benchmark.json`
(schema below, read by the report), `benchmark.md`, `per_prompt.jsonl` (one row per
prompt and setting; `setting` is "baseline", "k=3" or "tree 3/2/6"; `k` is the chain's
k, 0 for the baseline, null for a tree; `prompt_tokens` the rendered prompt's length;
baseline rows have no verify steps) and `manifest.json`.

benchmark.json: {key, device, dtype, max_new_tokens, k, trees: [{num_steps, topk,
num_draft_tokens}], wall_s, lossless, prompt_sets: {name: {prompts, draft_vocab_coverage,
baseline: {tokens, seconds, tokens_per_s}, by_k: {"<k>": {acceptance_length,
acceptance_rate, per_position, verify_steps, tokens, seconds, tokens_per_s, speedup}},
by_tree: {"<num_steps>-<topk>-<num_draft_tokens>": {num_steps, topk, num_draft_tokens,
acceptance_length, per_depth, verify_steps, tokens, seconds, tokens_per_s, speedup}},
by_length: [{bucket, min_tokens, max_tokens, prompts, settings: {"<label>": acceptance_length},
verify_steps: {"<label>": verify_steps}}]}}, recommended: {setting, num_steps, topk,
num_draft_tokens, mean_speedup, flags, command, placeholders: {TARGET_MODEL, DRAFT_DIR},
checked_by_sglang}, long_context: {flagged, threshold, buckets: [{prompt_set, setting,
bucket, prompts, acceptance_length, reference_bucket, reference_acceptance_length,
share}], draft: {training_max_length, max_position_embeddings, rope_scaling}, reason},
by_set: {setting, best_set, threshold, sets: {name: {acceptance_length, speedup,
share_of_best}}, flagged: [name], reason}}.

Tokens count every generated token; AL counts the tokens of verify steps (see
spec_decode): per_position[i-1] (per_depth[d-1]) is the share of verify steps that
accepted at least i proposals (a path d deep), so AL = 1 + sum(per_position) (+ sum
(per_depth)) holds exactly; a tree's AL is at most num_steps + 1.

`by_length` splits each set's per-prompt rows by prompt tokens into the buckets of
`evaluate.length_buckets` (buckets without a prompt left out; min/max_tokens inclusive,
max null for the open last one; an AL null where the bucket made no verify step), and
`long_context` flags a longer bucket whose AL for the recommended setting falls below
`evaluate.long_context_drop` of the shortest bucket's (see `length`); nothing is decoded
twice for either.

`by_set` compares the prompt sets at the recommended setting and flags a set whose AL
falls below `evaluate.prompt_set_drop` of the best set's (see `sets`).

`recommended` is the setting, chain or tree, with the highest mean over the prompt sets
of the per-set speed-ups (the earlier of equals: chains in k order, then trees in config
order), as SGLang flags (a chain of k is num_steps k, topk 1, k+1 draft tokens) and an
example `sglang.launch_server` command line built by the serving benchmark's builder from
`serve_benchmark.sglang` (python, tp_size, memory, context, extra args; port 30000 when
unset), with "$TARGET_MODEL" and "$DRAFT_DIR" standing for the target and the export's
`sglang/` directory (`placeholders` gives this run's: the evaluated target, the planned
export). `checked_by_sglang` says whether SGLang's own argument parser read it (only
where SGLang is importable; elsewhere the flags are checked against the ones the builder
knows).
"""

from __future__ import annotations

import json
import logging
import math
import os
import shlex
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from statistics import fmean
from typing import TYPE_CHECKING

from draftsmith.errors import DraftsmithError
from draftsmith.evaluate.length import by_length, length_markdown, long_context, long_context_markdown
from draftsmith.evaluate.sets import by_set, sets_markdown
from draftsmith.evaluate.settings import best_result, recommendation_markdown
from draftsmith.export import AUX_LAYER_CONVENTION, SGLANG, load_sglang_export
from draftsmith.formats.markdown import coverage_sentence
from draftsmith.formats.prompt_sets import EvalPrompt, check_overlap, load_prompt_set, training_prompts
from draftsmith.runtime import gpus, jobs
from draftsmith.runtime.resources import evaluate_gpus
from draftsmith.runtime.sglang import speculative_flags
from draftsmith.serve_bench import EAGLE3, check_launch, launch_command
from draftsmith.speculation import BASELINE, Speculation
from draftsmith.store import atomic, manifest
from draftsmith.store.journal import Journal
from draftsmith.store.plan import EXPORT_FILES, JOURNAL, plan_for
from draftsmith.target import load as target

if TYPE_CHECKING:
    from draftsmith.draft.model import Eagle3Draft
    from draftsmith.evaluate.spec_decode import AcceptFn, Decoded, TreeAcceptFn
    from draftsmith.target.layers import AuxLayers

log = logging.getLogger(__name__)


class EvaluationError(DraftsmithError):
    """The evaluation cannot run or its results do not add up."""


class LosslessError(EvaluationError):
    """Speculative decoding produced other tokens than the target's own greedy decoding."""


# The recommended command's placeholders and the port it shows when serve_benchmark sets none.
TARGET_MODEL, DRAFT_DIR = "TARGET_MODEL", "DRAFT_DIR"
EXAMPLE_PORT = 30000  # SGLang's default


@dataclass(frozen=True)
class Settings:
    measured: list[Speculation]  # chains in k order, then trees in config order
    max_new_tokens: int
    stops: list[int]
    warmup_prompts: int


def section_key(setting: Speculation) -> tuple[str, str]:
    """Where benchmark.json's prompt sets hold a setting's results: section and key."""
    if setting.is_chain:
        return "by_k", str(setting.num_steps)
    return "by_tree", f"{setting.num_steps}-{setting.topk}-{setting.num_draft_tokens}"


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


def draft_context(export_dir: Path, training_max_length: int) -> dict:
    """What the long-context flag says of the draft: the longest sample it trained on
    (tokenize.max_length), and the positions and RoPE scaling (null: plain RoPE) its
    exported config serves it with."""
    config = json.loads((export_dir / EXPORT_FILES["config"]).read_text())
    return {
        "training_max_length": training_max_length,
        "max_position_embeddings": config.get("max_position_embeddings"),
        "rope_scaling": config.get("rope_scaling"),
    }


# --- measuring ------------------------------------------------------------------------
def check_lossless(
    model, set_name: str, prompt: EvalPrompt, setting: str, expected: list[int], got: list[int]
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
        f"prompt set {set_name!r} prompt {prompt.id}, {setting}: speculative output differs from the "
        f"target's greedy output at generated position {at}: greedy {want}, speculative {have} "
        f"(target top-2 logit margin there: {margin:.3g}; a margin near 0 is a numerical near-tie, "
        "evaluate in float32)"
    )


def _acceptance(runs: list[Decoded], depth: int, shares: str) -> dict:
    """AL over the verify steps of `runs`, and under `shares` the share of verify steps that
    accepted at least d proposals, d = 1..depth (chain positions, or tree depths)."""
    reach = [r for run in runs for r in run.reach]
    steps = len(reach)
    if not steps:
        raise EvaluationError("no verify step: every prompt ended at its first token (raise max_new_tokens)")
    per_depth = [sum(r >= d for r in reach) / steps for d in range(1, depth + 1)]
    length = sum(len(run.tokens) - 1 for run in runs) / steps  # the first token is the prefill's
    if not math.isclose(length, 1 + sum(per_depth), rel_tol=1e-9):
        raise EvaluationError(f"AL {length} != 1 + sum({shares}) {1 + sum(per_depth)}")
    return {"acceptance_length": length, shares: per_depth, "verify_steps": steps}


def _result(setting: Speculation, runs: list[Decoded]) -> dict:
    """A setting's acceptance: a chain's per position and rate, a tree's shape and per depth."""
    if not setting.is_chain:
        return {**setting.as_json(), **_acceptance(runs, setting.num_steps, "per_depth")}
    stats = _acceptance(runs, setting.num_steps, "per_position")
    rate = (stats["acceptance_length"] - 1) / setting.num_steps
    return {"acceptance_length": stats["acceptance_length"], "acceptance_rate": rate, **stats}


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


def _row(set_name: str, prompt: EvalPrompt, setting: Speculation | None, run: Decoded) -> dict:
    """A per-prompt row; `setting` None is the target alone."""
    steps = run.verify_steps if setting else None
    k = 0 if setting is None else setting.num_steps if setting.is_chain else None
    return {
        "prompt_set": set_name,
        "id": prompt.id,
        "setting": setting.label if setting else BASELINE,
        "k": k,
        "prompt_tokens": len(prompt.input_ids),
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
    accept_tree: TreeAcceptFn | None = None,
    desc: str = "evaluate",
    journal: Journal | None = None,
) -> tuple[dict, list[dict]]:
    """Warm up, then decode every prompt greedily and with each chain and tree; returns the
    `prompt_sets` section of benchmark.json and the per-prompt rows. `accept` and
    `accept_tree` replace the acceptance rules (tests use them to break verification);
    `desc` labels the progress bar. With a `journal`, each prompt's decodes are recorded once
    they pass the lossless check, and a prompt already recorded is not decoded again: a job
    stopped at prompt 71 of 79 resumes at prompt 72."""
    from draftsmith.evaluate import spec_decode as sd

    device = model.device
    n, stops = settings.max_new_tokens, settings.stops
    accept = accept or sd.longest_agreeing_prefix
    accept_tree = accept_tree or sd.accepted_path

    def base(p: EvalPrompt) -> Decoded:
        return sd.timed(device, lambda: sd.greedy(model, p.input_ids, n, stops))

    def decode(ids: list[int], setting: Speculation) -> Decoded:
        if setting.is_chain:
            return sd.speculative(model, draft, aux, ids, setting.num_steps, n, stops, accept)
        shape = (setting.num_steps, setting.topk, setting.num_draft_tokens)
        return sd.tree_speculative(model, draft, aux, ids, *shape, n, stops, accept_tree)

    def spec(p: EvalPrompt, setting: Speculation) -> Decoded:
        return sd.timed(device, lambda: decode(p.input_ids, setting))

    def measure(name: str, prompt: EvalPrompt) -> tuple[Decoded, list[Decoded]]:
        greedy = base(prompt)
        decoded = []
        for setting in measured:
            decoded.append(spec(prompt, setting))
            check_lossless(model, name, prompt, setting.label, greedy.tokens, decoded[-1].tokens)
        return greedy, decoded

    measured = settings.measured
    recorded = journal.records if journal is not None else {}
    pending = [
        p for name, prompts in prompt_sets.items() for p in prompts if _prompt_id(name, p) not in recorded
    ]
    for prompt in pending[: settings.warmup_prompts]:
        base(prompt)
        for setting in measured:
            spec(prompt, setting)
    total = sum(map(len, prompt_sets.values()))
    if journal is not None:
        log.info(
            "%s: %d prompts, %d measured before (journal), %d to decode",
            desc,
            total,
            total - len(pending),
            len(pending),
        )
    results, rows = {}, []
    bar = jobs.progress(total, desc, unit="prompt", initial=total - len(pending))
    for name, prompts in prompt_sets.items():
        baseline, runs = [], {setting: [] for setting in measured}
        for prompt in prompts:
            record_id = _prompt_id(name, prompt)
            if record_id in recorded:
                greedy, decoded = _from_record(recorded[record_id], measured)
            else:
                greedy, decoded = measure(name, prompt)
                if journal is not None:
                    journal.append(_record(record_id, greedy, measured, decoded))
                bar.update()
            baseline.append(greedy)
            rows.append(_row(name, prompt, None, greedy))
            for setting, run in zip(measured, decoded, strict=True):
                runs[setting].append(run)
                rows.append(_row(name, prompt, setting, run))
        results[name] = {**_summary(baseline, runs), "draft_vocab_coverage": vocab_coverage(draft, baseline)}
        log.info("%s: %s", name, json.dumps(results[name]))
    bar.close()
    return results, rows


def _prompt_id(set_name: str, prompt: EvalPrompt) -> str:
    return f"{set_name}/{prompt.id}"


def _record(record_id: str, greedy: Decoded, measured: list[Speculation], decoded: list[Decoded]) -> dict:
    """One prompt's decodes, as the journal keeps them (the baseline under its own label)."""
    runs = {BASELINE: greedy, **{s.label: run for s, run in zip(measured, decoded, strict=True)}}
    return {"id": record_id, "runs": {label: asdict(run) for label, run in runs.items()}}


def _from_record(record: dict, measured: list[Speculation]) -> tuple[Decoded, list[Decoded]]:
    from draftsmith.evaluate.spec_decode import Decoded

    runs = {label: Decoded(**run) for label, run in record["runs"].items()}
    return runs[BASELINE], [runs[s.label] for s in measured]


def _summary(baseline: list[Decoded], runs: dict[Speculation, list[Decoded]]) -> dict:
    base = _throughput(baseline)
    summary = {"prompts": len(baseline), "baseline": base, "by_k": {}, "by_tree": {}}
    for setting, decoded in runs.items():
        speed = _throughput(decoded)
        speed["speedup"] = speed["tokens_per_s"] / base["tokens_per_s"]
        section, key = section_key(setting)
        summary[section][key] = {**_result(setting, decoded), **speed}
    return summary


# --- the recommendation ---------------------------------------------------------------
@dataclass(frozen=True)
class Launch:
    """A setting's SGLang flags, its example launch command, and whether SGLang's parser read it."""

    flags: list[str]
    command: list[str]
    checked_by_sglang: bool


def sglang_launch(config: dict, setting: Speculation) -> Launch:
    """The serving benchmark's builder and launch settings, with the draft at `setting` and
    placeholders for the target and the draft."""
    bench = config["serve_benchmark"]
    served = speculative_flags(setting, EAGLE3, f"${DRAFT_DIR}")
    cmd = launch_command(f"${TARGET_MODEL}", bench, bench["sglang"]["port"] or EXAMPLE_PORT, served)
    return Launch(speculative_flags(setting, EAGLE3), cmd, check_launch(cmd, served))


def command_line(cmd: list[str]) -> str:
    """`cmd` for a POSIX shell, the placeholders left to expand."""
    placeholders = {f"${TARGET_MODEL}", f"${DRAFT_DIR}"}
    return " ".join(f'"{arg}"' if arg in placeholders else shlex.quote(arg) for arg in cmd)


def recommend(prompt_sets: dict, launches: dict[Speculation, Launch], placeholders: dict[str, str]) -> dict:
    """benchmark.json's `recommended`: of the settings in `launches`, the one with the highest
    mean of the per-prompt-set speed-ups (the first of equals)."""

    def mean_speedup(setting: Speculation) -> float:
        section, key = section_key(setting)
        return fmean(result[section][key]["speedup"] for result in prompt_sets.values())

    best = max(launches, key=mean_speedup)
    launch = launches[best]
    return {
        "setting": best.label,
        **best.as_json(),
        "mean_speedup": mean_speedup(best),
        "flags": launch.flags,
        "command": command_line(launch.command),
        "placeholders": placeholders,
        "checked_by_sglang": launch.checked_by_sglang,
    }


# --- reporting ------------------------------------------------------------------------
def markdown(benchmark: dict) -> str:
    lines = [
        f"# Draft evaluation `{benchmark['key']}`",
        "",
        f"Chain and tree speculative decoding, greedy, checked lossless. Device: {benchmark['device']}, "
        f"dtype {benchmark['dtype']}, max_new_tokens {benchmark['max_new_tokens']}, "
        f"wall {benchmark['wall_s']:.1f} s.",
    ]
    warning = long_context_markdown(benchmark["long_context"])
    lines += ["", warning.rstrip()] if warning else []
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
        lines += _tree_table(result)
        lines.append(length_markdown(result).rstrip())
        label, best = best_result(result)
        lines += ["", f"Best: {label}, {best['speedup']:.2f}x at AL {best['acceptance_length']:.3f}."]
    comparison = sets_markdown(benchmark["by_set"], benchmark["prompt_sets"])
    return "\n".join(lines) + "\n\n" + comparison + "\n" + recommendation_markdown(benchmark["recommended"])


def _tree_table(result: dict) -> list[str]:
    if not result["by_tree"]:
        return []
    lines = [
        "",
        "| tree (num_steps/topk/num_draft_tokens) | AL | bound num_steps+1 | per-depth acceptance "
        "| tok/s draft | tok/s baseline | speed-up |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in result["by_tree"].values():
        depths = " ".join(f"{p:.2f}" for p in r["per_depth"])
        lines.append(
            f"| {Speculation.of(r).shape} | {r['acceptance_length']:.3f} | {r['num_steps'] + 1} | "
            f"{depths} | {r['tokens_per_s']:.1f} | {result['baseline']['tokens_per_s']:.1f} | "
            f"{r['speedup']:.2f}x |"
        )
    return lines


# --- the stage ------------------------------------------------------------------------
def load_models(config: dict, model_info: dict, export_dir: Path):
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
    plan = plan_for(config)
    artifact = plan.evaluate
    ev = config["evaluate"]
    if not ev["prompt_sets"]:
        raise EvaluationError("evaluate.prompt_sets is empty: configure at least one held-out prompt set")
    model_info = target.model_info(inputs["model"])
    tokenizer = target.load_tokenizer(model_info["hf_dir"], config["model"]["trust_remote_code"])
    system_prompt = config["generation"]["system_prompt"]
    sets = {
        name: load_prompt_set(
            name, entry, tokenizer, system_prompt, artifact.params["prompt_sets"][name]["source"]
        )
        for name, entry in sorted(ev["prompt_sets"].items())
    }
    check_overlap(sets, training_prompts(inputs["merged"], inputs["responses"]))
    trees = [Speculation.of(tree) for tree in ev["trees"]]
    measured = [Speculation.chain(k) for k in ev["k"]] + trees
    settings = Settings(measured, ev["max_new_tokens"], stop_ids(model_info), ev["warmup_prompts"])
    # Every launch is built (and so checked) before any decoding: a refusal comes first.
    launches = {setting: sglang_launch(config, setting) for setting in settings.measured}
    export_dir = Path(inputs["export_config"]).parent
    with gpus.acquire_gpus(evaluate_gpus(config)):
        model, draft, aux = load_models(config, model_info, export_dir)
        journal = Journal(Path(outputs["json"]).parent / JOURNAL)
        try:
            results, rows = benchmark_sets(model, draft, aux, sets, settings, journal=journal)
        finally:
            journal.close()
        device = device_name(model.device)
    for name, table in by_length(rows, ev["length_buckets"]).items():
        results[name]["by_length"] = table
    placeholders = {
        TARGET_MODEL: str(model_info["hf_dir"]),
        DRAFT_DIR: str(plan.export.path("sglang_config").parent),
    }
    recommended = recommend(results, launches, placeholders)
    draft_info = draft_context(export_dir, config["tokenize"]["max_length"])
    benchmark = {
        "key": artifact.key,
        "device": device,
        "dtype": ev["dtype"],
        "max_new_tokens": ev["max_new_tokens"],
        "k": ev["k"],
        "trees": [tree.as_json() for tree in trees],
        "wall_s": time.time() - started,
        "lossless": True,
        "prompt_sets": results,
        "recommended": recommended,
        "long_context": long_context(results, recommended, ev["long_context_drop"], draft_info),
        "by_set": by_set(results, recommended["setting"], ev["prompt_set_drop"]),
    }
    if benchmark["long_context"]["flagged"]:
        log.warning("long context: %s", benchmark["long_context"]["reason"])
    if benchmark["by_set"]["flagged"]:
        log.warning("prompt sets: %s", benchmark["by_set"]["reason"])
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
