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
example `sglang.launch_server` command line (one GPU, port 30000, at the context the draft
is exported for; see `launch`), with "$TARGET_MODEL" and "$DRAFT_DIR" standing for the
target and the export's `sglang/` directory (`placeholders` gives this run's: the
evaluated target, the planned export). `checked_by_sglang` says whether SGLang's own
argument parser read it (only where SGLang is importable; elsewhere the flags are checked
against the ones draftsmith knows SGLang by).
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from draftsmith.evaluate.launch import DRAFT_DIR, TARGET_MODEL, recommend, sglang_launch
from draftsmith.evaluate.length import by_length, long_context
from draftsmith.evaluate.markdown import markdown
from draftsmith.evaluate.measure import EvaluationError, Settings, benchmark_sets
from draftsmith.evaluate.sets import by_set
from draftsmith.evaluate.settings import EvaluateSettings
from draftsmith.export import AUX_LAYER_CONVENTION, SGLANG, load_sglang_export
from draftsmith.formats.prompt_sets import check_overlap, load_prompt_set, training_prompts
from draftsmith.fsutil import atomic
from draftsmith.runtime import gpus
from draftsmith.store import manifest
from draftsmith.store.journal import Journal
from draftsmith.store.layout import EXPORT_FILES, JOURNAL
from draftsmith.store.plan import Artifact
from draftsmith.target import load as target

if TYPE_CHECKING:
    from draftsmith.target.layers import AuxLayers

log = logging.getLogger(__name__)


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


def load_models(model_info: dict, export_dir: Path, *, dtype: str, device: str, trust_remote_code: bool):
    """The target (in `dtype`, on `device`), the exported draft on its device, and the aux layers."""
    import torch

    # Verifying k+1 tokens at once must pick the argmax one-at-a-time decoding picks:
    # TF32 matmuls would turn near-ties into false lossless failures.
    torch.set_float32_matmul_precision("highest")
    torch.backends.cudnn.allow_tf32 = False
    model = target.load_model(model_info["hf_dir"], dtype, device, trust_remote_code)
    embed = model.get_input_embeddings().weight
    draft = load_sglang_export(export_dir, embed, compute_dtype=dtype).to(model.device).eval()
    return model, draft, export_aux_layers(export_dir, model_info["num_hidden_layers"])


def evaluate(
    settings: EvaluateSettings,
    artifact: Artifact,
    inputs: dict,
    outputs: dict,
    log_file: str | None = None,
    *,
    export: Artifact,
) -> dict:
    """Rule `evaluate`: benchmark the exported SGLang draft (planned as `export`, whose
    `sglang/` directory the recommended launch names) on the held-out prompt sets."""
    from draftsmith.target.special_tokens import stop_ids

    started = time.time()
    model_info = target.model_info(inputs["model"])
    tokenizer = target.load_tokenizer(model_info["hf_dir"], settings.trust_remote_code)
    planned = artifact.params["prompt_sets"]
    sets = {
        entry.name: load_prompt_set(
            entry.name, entry.as_entry(), tokenizer, settings.system_prompt, planned[entry.name]["source"]
        )
        for entry in settings.prompt_sets
    }
    check_overlap(sets, training_prompts(inputs["merged"], inputs["responses"]))
    decoding = Settings(
        list(settings.measured), settings.max_new_tokens, stop_ids(model_info), settings.warmup_prompts
    )
    # Every launch is built (and so checked) before any decoding: a refusal comes first.
    launches = {setting: sglang_launch(setting, settings.launch_context) for setting in settings.measured}
    export_dir = Path(inputs["export_config"]).parent
    with gpus.acquire_gpus(settings.gpus):
        model, draft, aux = load_models(
            model_info,
            export_dir,
            dtype=settings.dtype,
            device=settings.device,
            trust_remote_code=settings.trust_remote_code,
        )
        journal = Journal(Path(outputs["json"]).parent / JOURNAL)
        try:
            results, rows = benchmark_sets(model, draft, aux, sets, decoding, journal=journal)
        finally:
            journal.close()
        device = device_name(model.device)
    for name, table in by_length(rows, list(settings.length_buckets)).items():
        results[name]["by_length"] = table
    placeholders = {
        TARGET_MODEL: str(model_info["hf_dir"]),
        DRAFT_DIR: str(export.path("sglang_config").parent),
    }
    recommended = recommend(results, launches, placeholders)
    draft_info = draft_context(export_dir, settings.training_max_length)
    benchmark = {
        "key": artifact.key,
        "device": device,
        "dtype": settings.dtype,
        "max_new_tokens": settings.max_new_tokens,
        "k": [chain.num_steps for chain in settings.chains],
        "trees": [tree.as_json() for tree in settings.trees],
        "wall_s": time.time() - started,
        "lossless": True,
        "prompt_sets": results,
        "recommended": recommended,
        "long_context": long_context(results, recommended, settings.long_context_drop, draft_info),
        "by_set": by_set(results, recommended["setting"], settings.prompt_set_drop),
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
