"""Hidden states: rules `hidden_assign` (samples per shard), `hidden_estimate` (bytes,
hours, free disk) and `hidden_shard` (one job per shard)."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

from draftsmith.errors import DataError
from draftsmith.hidden import assign, estimate
from draftsmith.runtime import gpus
from draftsmith.runtime.jobs import progress
from draftsmith.runtime.resources import hidden_gpus
from draftsmith.store import atomic, manifest
from draftsmith.store.plan import plan_for
from draftsmith.store.staging import Staged
from draftsmith.target import layers
from draftsmith.target.load import load_model, model_info

if TYPE_CHECKING:
    from draftsmith.hidden.hf import MergedSample

log = logging.getLogger(__name__)


def hidden_assign(config: dict, inputs: dict, outputs: dict, log_file: str | None = None) -> dict:
    """Spread the merged samples over the configured shard count; refuse a plan the disk
    cannot hold before any shard job starts."""
    started = time.time()
    plan = plan_for(config)
    assignment = assign.build(Path(inputs["merged"]), config["extract"]["num_shards"], plan.shard_names)
    assignment.update(hidden_key=plan.hidden.key, merged_key=plan.merged.key, model_key=plan.model.key)
    figures = _estimate(config, assignment, model_info(inputs["model"]), plan.hidden.directory)
    estimate.check_disk(
        figures["bytes_needed"],
        figures["free_bytes"],
        config["extract"]["allow_disk_overcommit"],
        f"extraction of {figures['tokens']:,} tokens ({figures['storage_mode']})",
    )
    atomic.write_json(outputs["assignment"], assignment)
    stats = {k: assignment[k] for k in ("num_shards", "num_samples", "num_tokens")}
    manifest.write(plan.hidden, outputs["manifest"], [Path(outputs["assignment"])], stats, started)
    return assignment


def hidden_estimate(config: dict, inputs: dict, outputs: dict, log_file: str | None = None) -> dict:
    """`snakemake hidden_estimate`: shards, tokens, bytes per storage mode, hours, free disk."""
    plan = plan_for(config)
    assignment = json.loads(Path(inputs["assignment"]).read_text())
    figures = _estimate(config, assignment, model_info(inputs["model"]), plan.hidden.directory)
    atomic.write_json(outputs["json"], figures)
    atomic.write_text(outputs["md"], estimate.markdown(figures, config["experiment"]))
    log.info("estimate: %s", json.dumps(figures))
    return figures


def _estimate(config: dict, assignment: dict, info: dict, hidden_dir: Path) -> dict:
    dtype = config["extract"]["dtype"] or config["model"]["dtype"]
    return estimate.estimate(assignment, info["hidden_size"], dtype, config["extract"], hidden_dir)


def hidden_shard(config: dict, shard: str, inputs: dict, outputs: dict, log_file: str | None = None) -> dict:
    """One shard: aux and final states of its samples, verified while written.

    Written under `.staged/` and linked into place (`store.staging`): after a kill only
    unfinished shards are computed again."""
    # torch loads here, not in the assign and estimate jobs that share this module.
    from draftsmith.formats.shards import ShardWriter, bytes_per_token
    from draftsmith.hidden.hf import AuxCapture, extract

    extract_cfg = config["extract"]
    plan = plan_for(config)
    staged = Staged([outputs["bin"], outputs["index"]], shard, {"key": plan.hidden.key})
    if staged.reuse():
        return json.loads(Path(outputs["index"]).read_text())
    entry = next(
        s for s in json.loads(Path(inputs["assignment"]).read_text())["shards"] if s["name"] == shard
    )
    samples = _shard_samples(Path(inputs["merged"]), entry["samples"])
    info = model_info(inputs["model"])
    dtype = extract_cfg["dtype"] or config["model"]["dtype"]
    aux = layers.config_aux_layers(extract_cfg, info["num_hidden_layers"])
    needed = entry["num_tokens"] * bytes_per_token(info["hidden_size"], dtype, extract_cfg["storage"])
    out = Path(outputs["bin"]).parent
    estimate.check_disk(round(needed), estimate.free_bytes(out), extract_cfg["allow_disk_overcommit"], shard)
    backend = extract_cfg["backend"]
    meta = {
        "layers": aux.as_manifest(),
        "model_key": plan.model.key,
        "data_key": plan.merged.key,
        "hidden_key": plan.hidden.key,
        "shard": shard,
        "backend": backend,
        "device": extract_cfg["device"],
    }
    bar = progress(entry["num_tokens"], f"extract {shard}", unit="tok")
    staged.start()
    with (
        gpus.acquire_gpus(hidden_gpus(config)),
        ShardWriter(
            staged.directory,
            shard,
            mode=extract_cfg["storage"],
            hidden_size=info["hidden_size"],
            dtype=dtype,
            meta=meta,
            zstd_level=extract_cfg["zstd_level"],
            zstd_threads=extract_cfg["zstd_threads"],
        ) as writer,
    ):
        if backend == "sglang":
            _extract_sglang(config, info, aux, samples, writer, bar.update, log_file)
        else:
            model = load_model(
                info["hf_dir"], dtype, extract_cfg["device"], config["model"]["trust_remote_code"]
            )
            extract(
                AuxCapture(model, aux.output_of),
                samples,
                writer,
                batch_tokens=extract_cfg["batch_tokens"],
                device=extract_cfg["device"],
                pad_id=info["special_tokens"]["pad_token_id"] or 0,
                writer_queue=extract_cfg["writer_queue"],
                on_written=bar.update,
            )
    bar.close()
    index = json.loads(staged.path(outputs["index"]).read_text())
    _check_counts(index, entry, shard)
    staged.finish({index["bin"]["name"]: index["bin"]["sha256"]})  # hashed while written
    log.info("%s: %d samples, %d tokens", shard, len(samples), entry["num_tokens"])
    return json.loads(Path(outputs["index"]).read_text())


def _shard_samples(merged: Path, wanted: list[str]) -> list[MergedSample]:
    from draftsmith.hidden.hf import MergedSample

    chosen = set(wanted)
    found = {
        s["id"]: MergedSample(s["id"], s["input_ids"], s["loss_mask"])
        for s in atomic.read_jsonl(merged)
        if s["id"] in chosen
    }
    missing = chosen - set(found)
    if missing:
        raise DataError(f"the shard assignment names samples it lacks: {sorted(missing)[:5]}", path=merged)
    return [found[i] for i in wanted]


def _check_counts(index: dict, entry: dict, shard: str) -> None:
    """The written shard holds exactly the assigned samples and tokens."""
    from draftsmith.hidden.hf import ExtractionError

    ids = sorted(row[0] for row in index["samples"])
    if ids != sorted(entry["samples"]) or index["num_tokens"] != entry["num_tokens"]:
        raise ExtractionError(
            f"{shard}: wrote {len(ids)} samples / {index['num_tokens']} tokens, "
            f"the assignment has {len(entry['samples'])} / {entry['num_tokens']}"
        )


def _extract_sglang(config, info, aux, samples, writer, on_written, log_file) -> None:
    """Two SGLang passes (aux states, then final states): hidden/sglang.py says why."""
    import torch

    from draftsmith.hidden import sglang as capture
    from draftsmith.hidden.hf import batches
    from draftsmith.target.dtypes import torch_dtype

    extract_cfg = config["extract"]
    grouped = list(batches(samples, extract_cfg["batch_tokens"]))
    passes: dict[str, list] = {}
    for mode in (capture.CaptureMode.AUX, capture.CaptureMode.FINAL):
        server_log = Path(log_file or writer.directory / "extract").with_suffix(f".sglang-{mode}.log")
        with capture.SGLangCapture(
            info["hf_dir"], extract_cfg["sglang"], aux, mode=mode, log_path=server_log
        ) as server:
            passes[mode] = [a for batch in grouped for a in server.capture([s.input_ids for s in batch])]
    ordered = [s for batch in grouped for s in batch]
    dtype = torch_dtype(extract_cfg["dtype"] or config["model"]["dtype"])
    paired = capture.pair_passes(passes[capture.CaptureMode.AUX], passes[capture.CaptureMode.FINAL])
    for sample, (aux_states, final) in zip(ordered, paired, strict=True):
        writer.add(
            sample.id,
            sample.input_ids,
            sample.loss_mask,
            torch.from_numpy(aux_states).to(dtype),
            torch.from_numpy(final).to(dtype),
        )
        on_written(len(sample.input_ids))
