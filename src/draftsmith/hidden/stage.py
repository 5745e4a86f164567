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
from draftsmith.hidden.settings import HiddenSettings
from draftsmith.runtime import gpus
from draftsmith.runtime.jobs import progress
from draftsmith.store import manifest
from draftsmith.store.hashing import sample_address
from draftsmith.store.layout import shard_name
from draftsmith.store.plan import Artifact
from draftsmith.store.staging import Staged
from draftsmith.target.load import load_model, model_info

if TYPE_CHECKING:
    from collections.abc import Callable

    from draftsmith.formats.shards.writer import ShardWriter
    from draftsmith.hidden.hf import MergedSample
    from draftsmith.target.layers import AuxLayers

log = logging.getLogger(__name__)


def hidden_assign(
    settings: HiddenSettings,
    artifact: Artifact,
    inputs: dict,
    outputs: dict,
    log_file: str | None = None,
    *,
    states: Artifact,
    root: Path,
) -> dict:
    """The mix's view (`artifact`) of the states store (`states`, in the store at `root`) and
    the shards it still needs (`hidden.assign`), under the store's assign lock; refuse
    extraction the disk cannot hold before any shard job starts."""
    started = time.time()
    store = states.directory
    assignment = assign.build_locked(Path(root), store, Path(inputs["merged"]), settings.num_shards)
    assignment.update(
        states_key=states.key, merged_key=artifact.upstream["merged"], model_key=states.upstream["model"]
    )
    figures = _estimate(settings, assignment, model_info(inputs["model"]), store)
    estimate.check_disk(
        figures["bytes_needed"],
        figures["free_bytes"],
        settings.allow_disk_overcommit,
        f"extraction of {figures['tokens']:,} tokens ({figures['storage_mode']})",
    )
    atomic.write_json(outputs["assignment"], assignment)
    stats = {
        k: assignment[k]
        for k in ("num_samples", "num_tokens", "distinct_samples", "stored_samples", "extract_tokens")
    }
    manifest.write(artifact, outputs["manifest"], [Path(outputs["assignment"])], stats, started)
    log.info(
        "%d of %d distinct samples stored; %d tokens to forward in %d shards (%d new)",
        assignment["stored_samples"],
        assignment["distinct_samples"],
        assignment["extract_tokens"],
        len(assignment["to_extract"]),
        len(assignment["new_shards"]),
    )
    return assignment


def hidden_estimate(
    settings: HiddenSettings, artifact: Artifact, inputs: dict, outputs: dict, log_file: str | None = None
) -> dict:
    """`snakemake hidden_estimate`: what extraction into the states store (`artifact`) still
    forwards and writes, hours, free disk."""
    assignment = json.loads(Path(inputs["assignment"]).read_text())
    figures = _estimate(settings, assignment, model_info(inputs["model"]), artifact.directory)
    atomic.write_json(outputs["json"], figures)
    atomic.write_text(outputs["md"], estimate.markdown(figures, settings.experiment))
    log.info("estimate: %s", json.dumps(figures))
    return figures


def _estimate(settings: HiddenSettings, assignment: dict, info: dict, hidden_dir: Path) -> dict:
    return estimate.estimate(
        assignment,
        info["hidden_size"],
        settings.dtype,
        hidden_dir,
        storage_mode=settings.storage,
        throughput_tok_s=settings.throughput_tok_s,
    )


def hidden_shard(
    settings: HiddenSettings,
    artifact: Artifact,
    inputs: dict,
    outputs: dict,
    log_file: str | None = None,
    *,
    shard: str,
) -> dict:
    """One stored shard of the states store `artifact`: aux and final states of the samples
    assigned to it, verified while written.

    Written under `.staged/` and linked into place (`store.staging`): after a kill only
    unfinished shards are computed again."""
    # torch loads here, not in the assign and estimate jobs that share this module.
    from draftsmith.formats.shards.codec import bytes_per_token
    from draftsmith.formats.shards.writer import ShardWriter
    from draftsmith.hidden.hf import AuxCapture, MergedSample, extract

    staged = Staged([outputs["bin"], outputs["index"]], shard, {"key": artifact.key})
    if staged.reuse():
        return json.loads(Path(outputs["index"]).read_text())
    samples = [
        MergedSample(row["address"], row["input_ids"], row["loss_mask"])
        for row in atomic.read_jsonl(inputs["samples"])
    ]
    _check_names(samples, shard, Path(inputs["samples"]))
    tokens = sum(len(s.input_ids) for s in samples)
    info = model_info(inputs["model"])
    aux = settings.aux(info["num_hidden_layers"])
    needed = tokens * bytes_per_token(info["hidden_size"], settings.dtype, settings.storage)
    out = Path(outputs["bin"]).parent
    estimate.check_disk(round(needed), estimate.free_bytes(out), settings.allow_disk_overcommit, shard)
    meta = {
        "layers": aux.as_manifest(),
        "model_key": artifact.upstream["model"],
        "states_key": artifact.key,
        "shard": shard,
        "backend": settings.backend,
        "device": settings.device,
        "sample_ids": "addresses (store.hashing.sample_address)",
    }
    bar = progress(tokens, f"extract {shard}", unit="tok")
    staged.start()
    with (
        gpus.acquire_gpus(settings.gpus),
        ShardWriter(
            staged.directory,
            shard,
            mode=settings.storage,
            hidden_size=info["hidden_size"],
            dtype=settings.dtype,
            meta=meta,
            zstd_level=settings.zstd_level,
            zstd_threads=settings.zstd_threads,
        ) as writer,
    ):
        if settings.sglang is not None:
            _extract_sglang(settings, info, aux, samples, writer, bar.update, log_file)
        else:
            model = load_model(info["hf_dir"], settings.dtype, settings.device, settings.trust_remote_code)
            extract(
                AuxCapture(model, aux.output_of),
                samples,
                writer,
                batch_tokens=settings.batch_tokens,
                device=settings.device,
                pad_id=info["special_tokens"]["pad_token_id"] or 0,
                writer_queue=settings.writer_queue,
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


def _extract_sglang(
    settings: HiddenSettings,
    info: dict,
    aux: AuxLayers,
    samples: list[MergedSample],
    writer: ShardWriter,
    on_written: Callable[[int], None],
    log_file: str | None,
) -> None:
    """Two SGLang passes (aux states, then final states): hidden/sglang.py says why."""
    import torch

    from draftsmith.hidden import sglang as capture
    from draftsmith.hidden.hf import batches
    from draftsmith.hidden.sglang_launch import CaptureMode
    from draftsmith.target.dtypes import torch_dtype

    grouped = list(batches(samples, settings.batch_tokens))
    passes: dict[str, list] = {}
    for mode in (CaptureMode.AUX, CaptureMode.FINAL):
        server_log = Path(log_file or writer.directory / "extract").with_suffix(f".sglang-{mode}.log")
        with capture.SGLangCapture(
            info["hf_dir"], settings.sglang, aux, mode=mode, log_path=server_log
        ) as server:
            passes[mode] = [a for batch in grouped for a in server.capture([s.input_ids for s in batch])]
    ordered = [s for batch in grouped for s in batch]
    dtype = torch_dtype(settings.dtype)
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
