"""The evaluator's measuring: the held-out prompt sets decoded by the target alone and
with each chain and tree (`benchmark_sets`), every speculative output checked lossless,
each prompt's decodes kept in the journal so a stopped job resumes; and the prompt sets'
results as benchmark.json holds them (`draftsmith.evaluate.stage`'s docstring gives its
schema and what AL and the shares count).

No torch at import: `spec_decode`, `tree_decode` and torch load inside the functions that decode.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from draftsmith.errors import DraftsmithError
from draftsmith.formats.prompt_sets import EvalPrompt
from draftsmith.runtime import jobs
from draftsmith.speculation import BASELINE, Speculation

if TYPE_CHECKING:
    from draftsmith.draft.model import Eagle3Draft
    from draftsmith.evaluate.spec_decode import AcceptFn, Decoded
    from draftsmith.evaluate.tree_decode import TreeAcceptFn
    from draftsmith.store.journal import Journal
    from draftsmith.target.layers import AuxLayers

log = logging.getLogger(__name__)


class EvaluationError(DraftsmithError):
    """The evaluation cannot run or its results do not add up."""


class LosslessError(EvaluationError):
    """Speculative decoding produced other tokens than the target's own greedy decoding."""


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
    accepted at least d proposals, d = 1..depth (chain positions, or tree depths); and the
    lowest and highest AL of one prompt (those with a verify step): how far a set's figure
    rests on a few prompts."""
    reach = [r for run in runs for r in run.reach]
    steps = len(reach)
    if not steps:
        raise EvaluationError("no verify step: every prompt ended at its first token (raise max_new_tokens)")
    per_depth = [sum(r >= d for r in reach) / steps for d in range(1, depth + 1)]
    length = sum(len(run.tokens) - 1 for run in runs) / steps  # the first token is the prefill's
    if not math.isclose(length, 1 + sum(per_depth), rel_tol=1e-9):
        raise EvaluationError(f"AL {length} != 1 + sum({shares}) {1 + sum(per_depth)}")
    per_prompt = [run.acceptance_length for run in runs if run.verify_steps]
    return {
        "acceptance_length": length,
        "acceptance_length_range": [min(per_prompt), max(per_prompt)],
        shares: per_depth,
        "verify_steps": steps,
    }


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
        "acceptance_length": run.acceptance_length if setting else None,
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
    from draftsmith.evaluate import tree_decode as td

    device = model.device
    n, stops = settings.max_new_tokens, settings.stops
    accept = accept or sd.longest_agreeing_prefix
    accept_tree = accept_tree or td.accepted_path

    def base(p: EvalPrompt) -> Decoded:
        return sd.timed(device, lambda: sd.greedy(model, p.input_ids, n, stops))

    def decode(ids: list[int], setting: Speculation) -> Decoded:
        if setting.is_chain:
            return sd.speculative(model, draft, aux, ids, setting.num_steps, n, stops, accept)
        shape = (setting.num_steps, setting.topk, setting.num_draft_tokens)
        return td.tree_speculative(model, draft, aux, ids, *shape, n, stops, accept_tree)

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
