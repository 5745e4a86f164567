"""Draft training: rule `train_segment` (one checkpoint segment per job) and rule `train`
(the final weights, config and training summary)."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import torch
from safetensors.torch import save as save_tensors

from draftsmith.draft.model import STEP_DECAY
from draftsmith.fsutil import atomic
from draftsmith.fsutil.digests import sha256_file
from draftsmith.runtime import gpus
from draftsmith.store import manifest
from draftsmith.store.plan import Artifact
from draftsmith.store.staging import Staged
from draftsmith.target.load import model_info
from draftsmith.train.launch import launch
from draftsmith.train.settings import TrainSettings, TrainSpec
from draftsmith.train.state import TrainError

log = logging.getLogger(__name__)


def spec(
    settings: TrainSettings, artifact: Artifact, info: dict, states: Artifact, inputs: dict
) -> TrainSpec:
    """What every training process of the draft `artifact` needs: the target (`info`), the
    states store `states`, and the job's assignment and vocabulary."""
    return TrainSpec(
        key=artifact.key,
        hf_dir=info["hf_dir"],
        trust_remote_code=settings.trust_remote_code,
        hidden_dir=str(states.directory),
        assignment=str(inputs["assignment"]),
        vocab=str(inputs["vocab"]),
        train=settings.loop,
    )


def train_segment(
    settings: TrainSettings,
    artifact: Artifact,
    inputs: dict,
    outputs: dict,
    log_file: str | None = None,
    *,
    segment: int,
    states: Artifact,
    threads: int = 1,
) -> dict:
    """One checkpoint segment of the draft `artifact`, trained on the states store `states`
    and resumed from the previous segment; staged so that a finished segment is never
    trained again (`store.staging`)."""
    previous = inputs.get("previous") or None
    if isinstance(previous, list | tuple):
        previous = previous[0] if previous else None
    previous_sha = sha256_file(Path(previous)) if previous else None
    staged = Staged(
        [outputs["checkpoint"], outputs["metrics"]],
        f"segment-{segment:05d}",
        {"key": artifact.key, "previous_sha256": previous_sha},
    )
    if staged.reuse():
        return {"segment": segment, "reused": True}
    staged.start()
    job_spec = spec(settings, artifact, model_info(inputs["model"]), states, inputs)
    with gpus.acquire_gpus(settings.gpus_held):
        launch(
            job_spec,
            segment,
            previous,
            staged.path(outputs["checkpoint"]),
            staged.path(outputs["metrics"]),
            world_size=settings.loop.gpus,
            threads=threads,
        )
    staged.finish()
    return {"segment": segment, "reused": False}


def train(
    settings: TrainSettings, artifact: Artifact, inputs: dict, outputs: dict, log_file: str | None = None
) -> dict:
    """Rule `train`: the trained weights (SGLang names, no embedding), config and summary."""
    started = time.time()
    total_steps = settings.loop.total_steps
    state = torch.load(inputs["checkpoint"], map_location="cpu", weights_only=True)
    if state["key"] != artifact.key or state["step"] != total_steps:
        raise TrainError(
            f"{inputs['checkpoint']}: draft {state['key']} at step {state['step']}, expected "
            f"{artifact.key} at step {total_steps}"
        )
    tensors = {name: t.contiguous() for name, t in state["model"].items()}
    with atomic.atomic_open(outputs["weights"], "wb") as handle:
        handle.write(save_tensors(tensors, metadata={"format": "pt"}))  # one entry: deterministic bytes
    atomic.write_json(outputs["config"], state["draft_config"])
    layers = json.loads(Path(inputs["shard"]).read_text())["meta"]["layers"]
    vocab_info = json.loads(Path(inputs["vocab_info"]).read_text())
    summary = summarize(settings.loop.ttt_steps, state, list(inputs["metrics"]), vocab_info, layers)
    atomic.write_json(outputs["summary"], summary)
    stats = {k: summary[k] for k in ("steps", "tokens_seen", "samples_seen", "wall_s")} | {
        "end": summary["end"]
    }
    files = [outputs[role] for role in ("weights", "config", "summary")]
    manifest.write(artifact, outputs["manifest"], files, stats, started)
    log.info("draft %s: %s", artifact.key, json.dumps(summary["end"]))
    return summary


def summarize(steps: int, state: dict, metrics_files: list[str], vocab_info: dict, layers: dict) -> dict:
    """The training summary of a draft of `steps` TTT steps: totals, end-of-training loss and
    accuracy per TTT position, the validation curve."""
    records = [r for path in metrics_files for r in atomic.read_jsonl(path)]
    train_records = [r for r in records if r["kind"] == "train"]
    val_records = [r for r in records if r["kind"] == "val"]
    last_segment = [r for r in atomic.read_jsonl(metrics_files[-1]) if r["kind"] == "train"]
    # Token-weighted over the last segment's steps: sum(loss x count) / sum(count) per position.
    end_train = {"steps": [last_segment[0]["step"], last_segment[-1]["step"]]}
    for field in ("loss_pos", "acc_pos"):
        end_train[field] = [
            sum(r[field][j] * r["count_pos"][j] for r in last_segment)
            / max(sum(r["count_pos"][j] for r in last_segment), 1)
            for j in range(steps)
        ]
    end_train["loss"] = sum(STEP_DECAY**j * x for j, x in enumerate(end_train["loss_pos"]))
    totals = state["totals"]
    return {
        "steps": state["step"],
        "epochs": round(train_records[-1]["epoch"], 3) if train_records else 0,
        "ttt_steps": steps,
        "tokens_seen": totals["tokens"],
        "samples_seen": totals["samples"],
        "wall_s": round(totals["wall_s"], 3),
        "tok_s": totals["tokens"] / totals["wall_s"] if totals["wall_s"] else None,
        "end": {"train": end_train, "val": val_records[-1] if val_records else None},
        "val_curve": [{"step": r["step"], "loss": r["loss"], "acc_pos": r["acc_pos"]} for r in val_records],
        "draft_vocab": vocab_info,
        "aux_layers": layers,
    }
