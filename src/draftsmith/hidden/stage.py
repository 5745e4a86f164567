"""Hidden states: rules `hidden_assign` (the mix's view of the states store, the samples
it lacks assigned to new shards), `hidden_estimate` (tokens to forward, bytes, hours,
free disk) and `hidden_shard` (one job per stored shard)."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

from draftsmith.errors import DataError
from draftsmith.fsutil import atomic
from draftsmith.hidden import assign, estimate
from draftsmith.runtime import gpus
from draftsmith.runtime.jobs import progress
from draftsmith.runtime.resources import hidden_gpus
from draftsmith.store import manifest
from draftsmith.store.hashing import sample_address
from draftsmith.store.layout import shard_name
from draftsmith.store.plan import plan_for
from draftsmith.store.staging import Staged
from draftsmith.target import layers
from draftsmith.target.load import load_model, model_info

if TYPE_CHECKING:
    from draftsmith.hidden.hf import MergedSample

log = logging.getLogger(__name__)


def hidden_assign(config: dict, inputs: dict, outputs: dict, log_file: str | None = None) -> dict:
    """The mix's view of the states store and the shards it still needs (`hidden.assign`),
    under the store's assign lock; refuse extraction the disk cannot hold before any shard
    job starts."""
    started = time.time()
    plan = plan_for(config)
    store = plan.states.directory
    assignment = assign.build_locked(
        plan.root, store, Path(inputs["merged"]), config["extract"]["num_shards"]
    )
    assignment.update(states_key=plan.states.key, merged_key=plan.merged.key, model_key=plan.model.key)
    figures = _estimate(config, assignment, model_info(inputs["model"]), store)
    estimate.check_disk(
        figures["bytes_needed"],
        figures["free_bytes"],
        config["extract"]["allow_disk_overcommit"],
        f"extraction of {figures['tokens']:,} tokens ({figures['storage_mode']})",
    )
    atomic.write_json(outputs["assignment"], assignment)
    stats = {
        k: assignment[k]
        for k in ("num_samples", "num_tokens", "distinct_samples", "stored_samples", "extract_tokens")
    }
    manifest.write(plan.hidden, outputs["manifest"], [Path(outputs["assignment"])], stats, started)
    log.info(
        "%d of %d distinct samples stored; %d tokens to forward in %d shards (%d new)",
        assignment["stored_samples"],
        assignment["distinct_samples"],
        assignment["extract_tokens"],
        len(assignment["to_extract"]),
        len(assignment["new_shards"]),
    )
    return assignment


def hidden_estimate(config: dict, inputs: dict, outputs: dict, log_file: str | None = None) -> dict:
    """`snakemake hidden_estimate`: what extraction still forwards and writes, hours, free disk."""
    plan = plan_for(config)
    assignment = json.loads(Path(inputs["assignment"]).read_text())
    figures = _estimate(config, assignment, model_info(inputs["model"]), plan.states.directory)
    atomic.write_json(outputs["json"], figures)
    atomic.write_text(outputs["md"], estimate.markdown(figures, config["experiment"]))
    log.info("estimate: %s", json.dumps(figures))
    return figures


def _estimate(config: dict, assignment: dict, info: dict, hidden_dir: Path) -> dict:
    dtype = config["extract"]["dtype"] or config["model"]["dtype"]
    return estimate.estimate(assignment, info["hidden_size"], dtype, config["extract"], hidden_dir)


def hidden_shard(config: dict, shard: str, inputs: dict, outputs: dict, log_file: str | None = None) -> dict:
    """One stored shard: aux and final states of the samples assigned to it, verified while
    written.

    Written under `.staged/` and linked into place (`store.staging`): after a kill only
    unfinished shards are computed again."""
    # torch loads here, not in the assign and estimate jobs that share this module.
    from draftsmith.formats.shards.codec import bytes_per_token
    from draftsmith.formats.shards.writer import ShardWriter
    from draftsmith.hidden.hf import AuxCapture, MergedSample, extract

    extract_cfg = config["extract"]
    plan = plan_for(config)
    staged = Staged([outputs["bin"], outputs["index"]], shard, {"key": plan.states.key})
    if staged.reuse():
        return json.loads(Path(outputs["index"]).read_text())
    samples = [
        MergedSample(row["address"], row["input_ids"], row["loss_mask"])
        for row in atomic.read_jsonl(inputs["samples"])
    ]
    _check_names(samples, shard, Path(inputs["samples"]))
    tokens = sum(len(s.input_ids) for s in samples)
    info = model_info(inputs["model"])
    dtype = extract_cfg["dtype"] or config["model"]["dtype"]
    aux = layers.config_aux_layers(extract_cfg, info["num_hidden_layers"])
    needed = tokens * bytes_per_token(info["hidden_size"], dtype, extract_cfg["storage"])
    out = Path(outputs["bin"]).parent
    estimate.check_disk(round(needed), estimate.free_bytes(out), extract_cfg["allow_disk_overcommit"], shard)
    backend = extract_cfg["backend"]
    meta = {
        "layers": aux.as_manifest(),
        "model_key": plan.model.key,
        "states_key": plan.states.key,
        "shard": shard,
        "backend": backend,
        "device": extract_cfg["device"],
        "sample_ids": "addresses (store.hashing.sample_address)",
    }
    bar = progress(tokens, f"extract {shard}", unit="tok")
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
    _check_counts(index, samples, tokens, shard)
    staged.finish({index["bin"]["name"]: index["bin"]["sha256"]})  # hashed while written
    log.info("%s: %d samples, %d tokens forwarded", shard, len(samples), tokens)
    return json.loads(Path(outputs["index"]).read_text())


def _check_names(samples: list[MergedSample], shard: str, path: Path) -> None:
    """The samples file holds what its shard's name says, each row under its own address."""
    for sample in samples:
        if sample_address(sample.input_ids, sample.loss_mask) != sample.id:
            raise DataError(f"a sample is not stored under its address {sample.id}", path=path)
    if shard_name([s.id for s in samples]) != shard:
        raise DataError(f"the samples do not make up shard {shard} (its name is their hash)", path=path)


def _check_counts(index: dict, samples: list[MergedSample], tokens: int, shard: str) -> None:
    """The written shard holds exactly the assigned samples and tokens."""
    from draftsmith.hidden.hf import ExtractionError

    ids = sorted(row[0] for row in index["samples"])
    if ids != sorted(s.id for s in samples) or index["num_tokens"] != tokens:
        raise ExtractionError(
            f"{shard}: wrote {len(ids)} samples / {index['num_tokens']} tokens, "
            f"the assignment has {len(samples)} / {tokens}"
        )


def _extract_sglang(config, info, aux, samples, writer, on_written, log_file) -> None:
    """Two SGLang passes (aux states, then final states): hidden/sglang.py says why."""
    import torch

    from draftsmith.hidden import sglang as capture
    from draftsmith.hidden.hf import batches
    from draftsmith.hidden.sglang_launch import CaptureMode
    from draftsmith.target.dtypes import torch_dtype

    extract_cfg = config["extract"]
    grouped = list(batches(samples, extract_cfg["batch_tokens"]))
    passes: dict[str, list] = {}
    for mode in (CaptureMode.AUX, CaptureMode.FINAL):
        server_log = Path(log_file or writer.directory / "extract").with_suffix(f".sglang-{mode}.log")
        with capture.SGLangCapture(
            info["hf_dir"], extract_cfg["sglang"], aux, mode=mode, log_path=server_log
        ) as server:
            passes[mode] = [a for batch in grouped for a in server.capture([s.input_ids for s in batch])]
    ordered = [s for batch in grouped for s in batch]
    dtype = torch_dtype(extract_cfg["dtype"] or config["model"]["dtype"])
    paired = capture.pair_passes(passes[CaptureMode.AUX], passes[CaptureMode.FINAL])
    for sample, (aux_states, final) in zip(ordered, paired, strict=True):
        writer.add(
            sample.id,
            sample.input_ids,
            sample.loss_mask,
            torch.from_numpy(aux_states).to(dtype),
            torch.from_numpy(final).to(dtype),
        )
        on_written(len(sample.input_ids))
