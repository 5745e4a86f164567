"""Rule `search`: which speculative settings make this target fastest, by successive halving.

The grid (`grid.build_grid`: every valid num_steps x topk x num_draft_tokens of the
`search` section) is decoded on one held-out prompt set (`search.prompt_set`) by the
built-in evaluator: the same models, decoding loops and lossless check as rule `evaluate`
(`benchmark_sets`), so every output equals the target's own greedy output or the job
fails naming the prompt and setting. A setting's score is its speed-up: tokens/s with the
draft over the target alone's on the same prompts. Round 1 decodes every setting on the
set's first `first_prompts` prompts; each next round keeps the best ceil(n / eta) and
doubles the prompts, until one setting is left (then decoded on every prompt of the set)
or the set is exhausted (`halving`). A survivor is decoded only on the prompts new to a
round: its earlier decodes are the same greedy outputs and count again, as does the
target alone's decode of each prompt (decoded once). Before timing, the first
`evaluate.warmup_prompts` prompts are decoded untimed by the target alone and by the
grid's first chain and first tree.

Outputs: `search.json` (below), `search.md` and `manifest.json`.

search.json: {key, device, dtype, max_new_tokens, prompt_set, prompts, first_prompts, eta,
grid_lists: {num_steps, topk, num_draft_tokens}, grid: [{setting, num_steps, topk,
num_draft_tokens}], skipped: [{num_steps, topk, num_draft_tokens, reason}], rounds:
[{round, prompts, settings: [label, best first], speedups: {label: speedup}}], table:
[{rank, setting, num_steps, topk, num_draft_tokens, round, prompts, acceptance_length,
tokens, seconds, tokens_per_s, baseline_tokens_per_s, speedup, command}], decodes, wall_s,
lossless, recommended: {setting, num_steps, topk, num_draft_tokens, speedup,
acceptance_length, prompts, flags, command, placeholders: {TARGET_MODEL, DRAFT_DIR},
checked_by_sglang}}.

`table` is the final ranking: a setting that reached a later round ranks higher, then the
higher speed-up at the last round it reached (ties: grid order, the smaller setting
first); its metrics are at that round, over its first `prompts` prompts. `recommended` is
the first row as SGLang flags and an example launch built like the evaluator's
(`sglang_launch`); `checked_by_sglang` says whether SGLang's own argument parser read it.
Labels are the evaluator's: "k=3" for a chain (topk 1), "tree 3/2/6" for a tree.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path

from draftsmith.errors import DraftsmithError
from draftsmith.evaluate import (
    DRAFT_DIR,
    TARGET_MODEL,
    EvaluateSettings,
    Launch,
    Settings,
    benchmark_sets,
    command_line,
    device_name,
    load_models,
    sglang_launch,
)
from draftsmith.formats.prompt_sets import EvalPrompt, check_overlap, load_prompt_set, training_prompts
from draftsmith.fsutil import atomic
from draftsmith.runtime import gpus
from draftsmith.search.halving import Round, best, ranking, schedule, successive_halving
from draftsmith.search.settings import SearchSettings
from draftsmith.search.summary import search_markdown
from draftsmith.speculation import BASELINE, Speculation
from draftsmith.store import manifest
from draftsmith.store.plan import SEARCH_GRID, Artifact
from draftsmith.target import load as target

log = logging.getLogger(__name__)

PromptSet = tuple[str, list[EvalPrompt]]  # a held-out set's name and rendered prompts


class SearchError(DraftsmithError):
    """The search cannot run on what it was given."""


class Measurements:
    """Every timed decode of the search, as the evaluator's per-prompt rows: the target
    alone's on each prompt decoded so far, and each setting's on its first prompts."""

    def __init__(
        self, models: tuple, set_name: str, prompts: list[EvalPrompt], max_new_tokens: int, stops: list[int]
    ) -> None:
        self.models = models  # target, draft, aux layers
        self.set_name = set_name
        self.prompts = prompts
        self.max_new_tokens = max_new_tokens
        self.stops = stops
        self.rows: list[dict] = []
        self.rounds = 0

    def decode(self, settings: Sequence[Speculation], prompts: list[EvalPrompt], desc: str) -> list[dict]:
        """Rows of the target alone and of each setting on `prompts`, each output checked lossless."""
        chosen = Settings(list(settings), self.max_new_tokens, self.stops, warmup_prompts=0)
        _, rows = benchmark_sets(*self.models, {self.set_name: prompts}, chosen, desc=desc)
        return rows

    def warm_up(self, settings: Sequence[Speculation], count: int) -> None:
        if count:
            self.decode(settings, self.prompts[:count], "search warm-up")  # untimed: rows dropped

    def speedups(self, alive: list[Speculation], prompts: int) -> dict[Speculation, float]:
        """One round (`halving.Measure`): `alive` decoded up to the set's first `prompts` prompts."""
        self.rounds += 1
        done = len({row["id"] for row in self.rows})  # every survivor has these already
        log.info(
            "round %d: %d settings on the first %d prompts of %s (%d new each)",
            self.rounds,
            len(alive),
            prompts,
            self.set_name,
            prompts - done,
        )
        self.rows += self.decode(alive, self.prompts[done:prompts], f"search round {self.rounds}")
        scores = {setting: self.result(setting)["speedup"] for setting in alive}
        ranked = ", ".join(f"{s.label} {scores[s]:.2f}x" for s in best(scores, alive))
        log.info("round %d speed-ups: %s", self.rounds, ranked)
        return scores

    def result(self, setting: Speculation) -> dict:
        """A setting's metrics over the prompts it was decoded on, against the target alone's there."""
        own = [row for row in self.rows if row["setting"] == setting.label]
        ids = {row["id"] for row in own}
        baseline = [row for row in self.rows if row["setting"] == BASELINE and row["id"] in ids]
        tokens, seconds = _totals(own)
        steps = sum(row["verify_steps"] for row in own)
        accepted = tokens - len(own)  # each prompt's first token is the prefill's, not a verify step's
        rate, baseline_rate = tokens / seconds, _rate(baseline)
        return {
            "prompts": len(own),
            "acceptance_length": accepted / steps if steps else None,
            "tokens": tokens,
            "seconds": seconds,
            "tokens_per_s": rate,
            "baseline_tokens_per_s": baseline_rate,
            "speedup": rate / baseline_rate,
        }


def _totals(rows: list[dict]) -> tuple[int, float]:
    return sum(row["tokens"] for row in rows), sum(row["seconds"] for row in rows)


def _rate(rows: list[dict]) -> float:
    tokens, seconds = _totals(rows)
    return tokens / seconds


def warm_up_settings(settings: Sequence[Speculation]) -> list[Speculation]:
    """The first chain and the first tree: every decoding path, at a fraction of the grid's cost."""
    chains = [s for s in settings if s.is_chain]
    trees = [s for s in settings if not s.is_chain]
    return chains[:1] + trees[:1]


def _log_schedule(settings: SearchSettings, prompts: int) -> None:
    grid = settings.grid
    for skipped in grid.skipped:
        log.info("skipped %s: %s", skipped.setting.shape, skipped.reason)
    rounds = schedule(len(grid.settings), settings.first_prompts, prompts, settings.eta)
    log.info(
        "%d settings in %d rounds (settings x prompts): %s",
        len(grid.settings),
        len(rounds),
        ", ".join(f"{size}x{count}" for size, count in rounds),
    )


def table_rows(
    ranked: list[tuple[Speculation, Round]], measurements: Measurements, commands: dict
) -> list[dict]:
    return [
        {
            "rank": rank,
            "setting": setting.label,
            **setting.as_json(),
            "round": reached.number,
            **measurements.result(setting),
            "command": commands[setting],
        }
        for rank, (setting, reached) in enumerate(ranked, 1)
    ]


def rounds_json(rounds: list[Round], settings: Sequence[Speculation]) -> list[dict]:
    return [
        {
            "round": r.number,
            "prompts": r.prompts,
            "settings": [s.label for s in best(r.scores, settings)],
            "speedups": {s.label: r.scores[s] for s in best(r.scores, settings)},
        }
        for r in rounds
    ]


def search(
    settings: SearchSettings,
    artifact: Artifact,
    inputs: dict,
    outputs: dict,
    log_file: str | None = None,
    *,
    evaluate: EvaluateSettings,
    export: Artifact,
) -> dict:
    """Rule `search`: successive halving over the grid on one held-out prompt set, decoded as
    `evaluate` decodes; the recommended launch names the `sglang/` directory of `export`."""
    started = time.time()
    model_info = target.model_info(inputs["model"])
    name, prompts = prompt_set = load_prompts(
        settings, evaluate, inputs, model_info, artifact.params["prompts"]["source"]
    )
    grid = settings.grid.settings
    # Every launch is built (and so checked) before any decoding: a refusal comes first.
    launches = {setting: sglang_launch(setting, evaluate.launch_context) for setting in grid}
    _log_schedule(settings, len(prompts))
    with gpus.acquire_gpus(evaluate.gpus):
        export_dir = Path(inputs["export_config"]).parent
        measurements, rounds, device = run_search(settings, evaluate, export_dir, model_info, prompt_set)
    commands = {setting: command_line(launch.command) for setting, launch in launches.items()}
    table = table_rows(ranking(grid, rounds), measurements, commands)
    winner = next(s for s in grid if s.label == table[0]["setting"])
    placeholders = {
        TARGET_MODEL: str(model_info["hf_dir"]),
        DRAFT_DIR: str(export.path("sglang_config").parent),
    }
    result = {
        "key": artifact.key,
        "device": device,
        "dtype": evaluate.dtype,
        "max_new_tokens": evaluate.max_new_tokens,
        "prompt_set": name,
        "prompts": len(prompts),
        "first_prompts": settings.first_prompts,
        "eta": settings.eta,
        "grid_lists": {key: list(getattr(settings, key)) for key in SEARCH_GRID},
        "grid": [{"setting": s.label, **s.as_json()} for s in grid],
        "skipped": [skipped.as_json() for skipped in settings.grid.skipped],
        "rounds": rounds_json(rounds, grid),
        "table": table,
        "decodes": len(measurements.rows),
        "wall_s": time.time() - started,
        "lossless": True,  # benchmark_sets raised otherwise
        "recommended": recommendation(table[0], launches[winner], placeholders),
    }
    log.info("recommended: %s", json.dumps(result["recommended"]))
    write_outputs(result, outputs)
    stats = {"device": device, "settings": len(grid), "rounds": len(rounds), "decodes": result["decodes"]}
    manifest.write(artifact, outputs["manifest"], [outputs["json"], outputs["md"]], stats, started)
    return result


def load_prompts(
    settings: SearchSettings, evaluate: EvaluateSettings, inputs: dict, model_info: dict, planned_sha256: str
) -> PromptSet:
    """The searched prompt set's name and prompts (its file's content hash `planned_sha256`),
    rendered as the evaluator renders them and checked against the training prompts (a
    trained-on prompt inflates acceptance)."""
    entry = settings.prompt_set
    tokenizer = target.load_tokenizer(model_info["hf_dir"], evaluate.trust_remote_code)
    prompts = load_prompt_set(entry.name, entry.as_entry(), tokenizer, evaluate.system_prompt, planned_sha256)
    if not prompts:
        raise SearchError(f"evaluate.prompt_sets.{entry.name}: no prompt to search on")
    check_overlap({entry.name: prompts}, training_prompts(inputs["merged"], inputs["responses"]))
    return entry.name, prompts


def run_search(
    settings: SearchSettings,
    evaluate: EvaluateSettings,
    export_dir: Path,
    model_info: dict,
    prompt_set: PromptSet,
) -> tuple[Measurements, list[Round], str]:
    """Load the models, warm up, run the rounds; the measurements, rounds and device name."""
    from draftsmith.target.special_tokens import stop_ids

    name, prompts = prompt_set
    models = load_models(
        model_info,
        export_dir,
        dtype=evaluate.dtype,
        device=evaluate.device,
        trust_remote_code=evaluate.trust_remote_code,
    )
    measurements = Measurements(models, name, prompts, evaluate.max_new_tokens, stop_ids(model_info))
    grid = settings.grid.settings
    measurements.warm_up(warm_up_settings(grid), evaluate.warmup_prompts)
    rounds = successive_halving(
        grid, settings.first_prompts, len(prompts), settings.eta, measurements.speedups
    )
    return measurements, rounds, device_name(models[0].device)


def recommendation(row: dict, launch: Launch, placeholders: dict[str, str]) -> dict:
    """search.json's `recommended`: the first row of the ranking as SGLang flags and a launch."""
    return {
        "setting": row["setting"],
        **{key: row[key] for key in ("num_steps", "topk", "num_draft_tokens")},
        **{key: row[key] for key in ("speedup", "acceptance_length", "prompts")},
        "flags": launch.flags,
        "command": row["command"],
        "placeholders": placeholders,
        "checked_by_sglang": launch.checked_by_sglang,
    }


def write_outputs(result: dict, outputs: dict) -> None:
    atomic.write_json(outputs["json"], result)
    atomic.write_text(outputs["md"], f"# Settings search `{result['key']}`\n\n" + search_markdown(result))
