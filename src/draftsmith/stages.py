"""Stage entry points: what each rule does, callable without Snakemake.

Each function takes the validated config and plain paths; `scripts/*.py` are
thin adapters that pass Snakemake's input/output/log to them (`from_snakemake`).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from draftsmith import atomic, jobs, manifest, special_tokens, target
from draftsmith import config as cfg
from draftsmith.keys import Plan

log = logging.getLogger("draftsmith.stages")


def from_snakemake(smk, stage: Callable[..., object]) -> None:
    """Run `stage` for a Snakemake `script:` job, logging to the rule's log."""
    # Before torch is imported: jobs sharing a small box must not each start one
    # OpenMP thread per core (a 2-core machine slowed ~25x when they did).
    os.environ["OMP_NUM_THREADS"] = str(smk.threads)
    with jobs.job(smk.log[0] if smk.log else None, f"{smk.rule} {dict(smk.wildcards)}"):
        stage(
            smk.config,
            inputs=dict(smk.input.items()),
            outputs=dict(smk.output.items()),
            log_file=smk.log[0] if smk.log else None,
            **dict(smk.params.items()),
        )


def plan_for(config: dict) -> Plan:
    from draftsmith.hashing import HashCache

    return Plan(config, HashCache(Path(config["artifacts_dir"]) / ".hash-cache.json"))


# --- model ---------------------------------------------------------------------
def build_model(config: dict, inputs: dict, outputs: dict, log_file: str | None = None) -> dict:
    """Fetch/convert the target and record its special tokens in model.json."""
    started = time.time()
    out = Path(outputs["info"]).parent
    model_cfg = config["model"]
    source = model_cfg["source"]
    files: list[Path] = []
    if source["kind"] == "hf_dir":
        hf_dir = Path(source["path"]).resolve()
        if not (hf_dir / "config.json").is_file():
            raise target.ModelError(f"model.source.path: no config.json in {hf_dir}")
    else:
        hf_dir = out / "hf"
        with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
            gguf = target.fetch_gguf(source, Path(tmp))
            target.convert_gguf(gguf, hf_dir, model_cfg["dtype"])
        files.append(hf_dir)
    info = describe_model(hf_dir, model_cfg)
    atomic.write_json(out / "model.json", info)
    files.append(out / "model.json")
    plan = plan_for(config)
    manifest.write(
        out / manifest.MANIFEST_NAME,
        stage="model",
        key=plan.model_key,
        files=files,
        params={"source": source, "dtype": model_cfg["dtype"]},
        upstream={},
        stats={"num_hidden_layers": info["num_hidden_layers"], "vocab_size": info["vocab_size"]},
        started=started,
    )
    return info


def describe_model(hf_dir: Path, model_cfg: dict) -> dict:
    from transformers import AutoConfig, GenerationConfig

    trust = model_cfg["trust_remote_code"]
    tokenizer = target.load_tokenizer(hf_dir, trust)
    hf_config = AutoConfig.from_pretrained(hf_dir, trust_remote_code=trust)
    text_config = hf_config.get_text_config()
    try:
        stop_ids = GenerationConfig.from_pretrained(hf_dir).eos_token_id
    except OSError:
        stop_ids = hf_config.eos_token_id
    model = None
    if model_cfg["probe_generation"]:
        model = target.load_model(hf_dir, model_cfg["dtype"], trust_remote_code=trust)
    tokens = special_tokens.inspect(tokenizer, stop_ids, model_cfg.get("end_of_turn_ids"), model)
    return {
        "hf_dir": str(hf_dir),
        "architectures": hf_config.architectures,
        "model_type": hf_config.model_type,
        "num_hidden_layers": text_config.num_hidden_layers,
        "hidden_size": text_config.hidden_size,
        "vocab_size": text_config.vocab_size,
        "max_position_embeddings": getattr(text_config, "max_position_embeddings", None),
        "dtype": model_cfg["dtype"],
        "special_tokens": tokens,
    }


def read_model_info(model_dir: str | Path) -> dict:
    return json.loads((Path(model_dir) / "model.json").read_text())


# --- responses -----------------------------------------------------------------
def _backend(config: dict, dataset: str, entry: dict, model_info: dict, server_log: Path):
    generation = entry["generation"]
    backend = generation["backend"]
    gen_cfg = config["generation"]
    served = gen_cfg["openai"]["model"] or model_info["hf_dir"]
    if backend == "hf":
        from draftsmith.generate.hf import HFBackend

        return HFBackend(
            dataset,
            model_info["hf_dir"],
            model_info,
            generation,
            gen_cfg["hf"],
            cfg.generation_dtype(config),
        )
    if backend == "openai":
        from draftsmith.generate.openai_api import OpenAIBackend

        return OpenAIBackend(dataset, gen_cfg["openai"], generation, served_model=served)
    from draftsmith.generate.sglang import SGLangBackend

    return SGLangBackend(
        dataset,
        model_info["hf_dir"],
        gen_cfg["sglang"],
        gen_cfg["openai"],
        generation,
        server_log,
    )


def generate_responses(
    config: dict, dataset: str, inputs: dict, outputs: dict, log_file: str | None = None
) -> dict:
    from draftsmith import datasets
    from draftsmith.generate import stage as generate_stage

    plan = plan_for(config)
    entry = cfg.dataset_settings(config, dataset)
    model_info = read_model_info(Path(inputs["model"]).parent)
    tokenizer = target.load_tokenizer(model_info["hf_dir"], config["model"]["trust_remote_code"])

    def count_tokens(messages: list[dict]) -> int:
        return len(
            tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=True, return_dict=False
            )
        )

    loaded = datasets.load_prompts(dataset, entry, count_tokens)
    # The server writes beside the rule log (the rule log is this job's own).
    server_log = Path(log_file or outputs["responses"]).with_suffix(".server.log")
    backend = _backend(config, dataset, entry, model_info, server_log)
    return generate_stage.run(
        dataset=dataset,
        loaded=loaded,
        backend=backend,
        out_dir=Path(outputs["responses"]).parent,
        key=plan.response_keys[dataset],
        params={"dataset": _public(entry)},
        upstream={"model": plan.model_key},
        openai_cfg=config["generation"]["openai"],
    )


def _public(entry: dict) -> dict:
    """Dataset settings as recorded in manifests (no secrets live in them)."""
    return {k: v for k, v in entry.items() if k != "enabled"}


# --- tokens --------------------------------------------------------------------
TOKENS_WORKERS = 8
TOKENS_PARALLEL_BYTES = 1 << 20  # ~1,000 short records: below this one process is quicker


def tokens_threads(responses: str) -> int:
    """Threads (worker processes) of a tokens job: a large dataset gets workers, a small one
    a single core and leaves the rest to other jobs. Decided by the responses file's size
    when the job starts; a dry run, before the file exists, shows 1."""
    try:
        large = os.path.getsize(responses) > TOKENS_PARALLEL_BYTES
    except OSError:
        return 1
    return TOKENS_WORKERS if large else 1


def tokenize_dataset(
    config: dict, dataset: str, inputs: dict, outputs: dict, log_file: str | None = None
) -> dict:
    from draftsmith.tokenize import ChatTokenizer, tokenize_records

    started = time.time()
    plan = plan_for(config)
    model_info = read_model_info(Path(inputs["model"]).parent)
    tokenizer = target.load_tokenizer(model_info["hf_dir"], config["model"]["trust_remote_code"])
    chat = ChatTokenizer(
        tokenizer,
        model_info["special_tokens"]["end_of_turn"]["ids"],
        config["tokenize"]["max_length"],
    )
    workers = int(os.environ.get("OMP_NUM_THREADS") or 1)  # the rule's threads
    samples, stats = tokenize_records(atomic.read_jsonl(inputs["responses"]), chat, dataset, workers)
    rate = stats.as_dict()["roundtrip_mismatch_rate"]
    limit = config["tokenize"]["max_roundtrip_mismatch"]
    if rate is not None and rate > limit:
        raise cfg.ConfigError(f"{dataset}: encode(decode(ids)) mismatch rate {rate:.3f} > {limit}")
    out = Path(outputs["tokens"]).parent
    atomic.write_jsonl(out / "tokens.jsonl", samples)
    manifest.write(
        out / manifest.MANIFEST_NAME,
        stage="tokens",
        key=plan.token_keys[dataset],
        files=[out / "tokens.jsonl"],
        params={"max_length": config["tokenize"]["max_length"]},
        upstream={"model": plan.model_key, "responses": plan.response_keys[dataset]},
        stats=stats.as_dict(),
        started=started,
    )
    log.info("%s: %s", dataset, json.dumps(stats.as_dict()))
    return stats.as_dict()


# --- merge ---------------------------------------------------------------------
def merge_datasets(
    config: dict, datasets: list[str], inputs: dict, outputs: dict, log_file: str | None = None
) -> dict:
    from draftsmith import merge, report

    started = time.time()
    plan = plan_for(config)
    tokens = dict(zip(datasets, inputs["tokens"], strict=True))
    responses = dict(zip(datasets, inputs["responses"], strict=True))
    per_dataset = {name: merge.read_samples(path) for name, path in tokens.items()}
    merged, taken = merge.merge(per_dataset, plan.merge_caps(), config["merge"]["seed"])
    out = Path(outputs["train"]).parent
    atomic.write_jsonl(out / "train.jsonl", merged)
    rows = [
        report.dataset_row(
            name,
            manifest.read(Path(responses[name]).parent / manifest.MANIFEST_NAME)["stats"],
            manifest.read(Path(tokens[name]).parent / manifest.MANIFEST_NAME)["stats"],
            taken[name],
        )
        for name in sorted(tokens)
    ]
    data_report = {
        "experiment": config["experiment"],
        "key": plan.merged_key,
        "seed": config["merge"]["seed"],
        "max_length": config["tokenize"]["max_length"],
        "excluded": config["merge"]["exclude"],
        "datasets": rows,
        "total": report.totals(rows),
    }
    atomic.write_json(out / "data_report.json", data_report)
    atomic.write_text(out / "data_report.md", report.markdown(data_report))
    manifest.write(
        out / manifest.MANIFEST_NAME,
        stage="merged",
        key=plan.merged_key,
        files=[out / "train.jsonl", out / "data_report.json", out / "data_report.md"],
        params={"seed": config["merge"]["seed"], "caps": plan.merge_caps()},
        upstream={f"tokens/{n}": plan.token_keys[n] for n in sorted(tokens)},
        stats={
            "samples": len(merged),
            "tokens": sum(len(s["input_ids"]) for s in merged),
            "per_dataset": taken,
        },
        started=started,
    )
    log.info("merged %d samples from %d datasets", len(merged), len(tokens))
    return data_report


# --- hidden states ---------------------------------------------------------------
def shard_plan(config: dict, inputs: dict, outputs: dict, log_file: str | None = None) -> dict:
    from draftsmith.extract import plan as extract_plan

    plan = plan_for(config)
    shard_plan = extract_plan.build(Path(inputs["merged"]), config["extract"]["num_shards"], plan.shard_names)
    shard_plan.update(hidden_key=plan.hidden_key, merged_key=plan.merged_key, model_key=plan.model_key)
    atomic.write_json(outputs["plan"], shard_plan)
    model_info = read_model_info(Path(inputs["model"]).parent)
    report = _plan_report(config, shard_plan, model_info, plan)
    extract_plan.check_disk(
        report["bytes_needed"],
        report["free_bytes"],
        config["extract"]["allow_disk_overcommit"],
        f"extraction of {report['tokens']:,} tokens ({report['storage_mode']})",
    )
    return report


def _plan_report(config: dict, shard_plan: dict, model_info: dict, plan: Plan) -> dict:
    from draftsmith.extract import plan as extract_plan

    dtype = config["extract"]["dtype"] or config["model"]["dtype"]
    return extract_plan.report(
        shard_plan, model_info["hidden_size"], dtype, config["extract"], plan.hidden_dir
    )


def plan_report(config: dict, inputs: dict, outputs: dict, log_file: str | None = None) -> dict:
    """`snakemake plan`: shards, tokens, bytes per storage mode, hours, free disk."""
    from draftsmith.extract import plan as extract_plan

    plan = plan_for(config)
    shard_plan = json.loads(Path(inputs["plan"]).read_text())
    report = _plan_report(config, shard_plan, read_model_info(Path(inputs["model"]).parent), plan)
    atomic.write_json(outputs["json"], report)
    atomic.write_text(outputs["md"], extract_plan.markdown(report, config["experiment"]))
    log.info("plan: %s", json.dumps(report))
    return report


def _shard_samples(merged: Path, wanted: list[str]):
    from draftsmith.extract.hf import MergedSample

    chosen = set(wanted)
    found = {
        s["id"]: MergedSample(s["id"], s["input_ids"], s["loss_mask"])
        for s in atomic.read_jsonl(merged)
        if s["id"] in chosen
    }
    missing = chosen - set(found)
    if missing:
        raise cfg.ConfigError(f"{merged}: the shard plan names samples it lacks: {sorted(missing)[:5]}")
    return [found[i] for i in wanted]


STAGED = ".staged"


def _reuse_staged(staged: Path, shard: str, hidden_key: str, outputs: dict) -> bool:
    """Link a verified shard finished by an earlier run into the declared outputs.

    Snakemake deletes a job's outputs before rerunning it, and a kill between the
    shard's last write and Snakemake's bookkeeping makes a finished shard look
    incomplete. Shards are therefore written under `.staged/` (not a declared
    output) and hard-linked into place: a rerun re-links verified bytes instead of
    recomputing them.
    """
    from draftsmith.shards import ShardError, ShardReader

    try:
        reader = ShardReader(staged, shard)
    except ShardError:
        return False
    if reader.manifest["meta"].get("hidden_key") != hidden_key or reader.verify():
        return False
    _link_outputs(staged, shard, outputs)
    log.info("%s: reusing the verified shard finished by an earlier run", shard)
    return True


def _link_outputs(staged: Path, shard: str, outputs: dict) -> None:
    for suffix, declared in ((".bin", outputs["bin"]), (".json", outputs["index"])):
        Path(declared).unlink(missing_ok=True)
        os.link(staged / f"{shard}{suffix}", declared)
    atomic.fsync_dir(Path(outputs["bin"]).parent)


def extract_shard(config: dict, shard: str, inputs: dict, outputs: dict, log_file: str | None = None) -> dict:
    from draftsmith import gpus, layers
    from draftsmith.extract import hf as extract_hf
    from draftsmith.extract import plan as extract_plan
    from draftsmith.shards import ShardWriter, bytes_per_token

    extract_cfg = config["extract"]
    plan = plan_for(config)
    out = Path(outputs["bin"]).parent
    staged = out / STAGED
    if _reuse_staged(staged, shard, plan.hidden_key, outputs):
        return json.loads(Path(outputs["index"]).read_text())
    shard_plan = json.loads(Path(inputs["plan"]).read_text())
    entry = next(s for s in shard_plan["shards"] if s["name"] == shard)
    samples = _shard_samples(Path(inputs["merged"]), entry["samples"])
    model_info = read_model_info(Path(inputs["model"]).parent)
    dtype = extract_cfg["dtype"] or config["model"]["dtype"]
    aux = layers.config_aux_layers(extract_cfg, model_info["num_hidden_layers"])
    needed = entry["num_tokens"] * bytes_per_token(model_info["hidden_size"], dtype, extract_cfg["storage"])
    extract_plan.check_disk(
        round(needed), extract_plan.free_bytes(out), extract_cfg["allow_disk_overcommit"], shard
    )
    backend = extract_cfg["backend"]
    meta = {
        "layers": aux.as_manifest(),
        "model_key": plan.model_key,
        "data_key": plan.merged_key,
        "hidden_key": plan.hidden_key,
        "shard": shard,
        "backend": backend,
        "device": extract_cfg["device"],
    }
    bar = jobs.progress(entry["num_tokens"], f"extract {shard}", unit="tok")
    staged.mkdir(parents=True, exist_ok=True)
    with (
        gpus.acquire_gpus(extract_gpus(config)),
        ShardWriter(
            staged,
            shard,
            mode=extract_cfg["storage"],
            hidden_size=model_info["hidden_size"],
            dtype=dtype,
            meta=meta,
            zstd_level=extract_cfg["zstd_level"],
            zstd_threads=extract_cfg["zstd_threads"],
        ) as writer,
    ):
        if backend == "sglang":
            _extract_sglang(config, model_info, aux, samples, writer, bar.update, log_file)
        else:
            model = target.load_model(
                model_info["hf_dir"], dtype, extract_cfg["device"], config["model"]["trust_remote_code"]
            )
            extract_hf.extract(
                extract_hf.AuxCapture(model, aux.output_of),
                samples,
                writer,
                batch_tokens=extract_cfg["batch_tokens"],
                device=extract_cfg["device"],
                pad_id=model_info["special_tokens"]["pad_token_id"] or 0,
                writer_queue=extract_cfg["writer_queue"],
                on_written=bar.update,
            )
    bar.close()
    _check_counts(json.loads((staged / f"{shard}.json").read_text()), entry, shard)
    _link_outputs(staged, shard, outputs)
    log.info("%s: %d samples, %d tokens", shard, len(samples), entry["num_tokens"])
    return json.loads(Path(outputs["index"]).read_text())


def _check_counts(index: dict, entry: dict, shard: str) -> None:
    """The written shard holds exactly the planned samples and tokens."""
    from draftsmith.extract.hf import ExtractionError

    ids = sorted(row[0] for row in index["samples"])
    if ids != sorted(entry["samples"]) or index["num_tokens"] != entry["num_tokens"]:
        raise ExtractionError(
            f"{shard}: wrote {len(ids)} samples / {index['num_tokens']} tokens, "
            f"the plan has {len(entry['samples'])} / {entry['num_tokens']}"
        )


def extract_gpus(config: dict) -> int:
    """GPUs one extraction job holds (also its Snakemake `gpu` resource)."""
    extract_cfg = config["extract"]
    if extract_cfg["backend"] == "sglang":
        return extract_cfg["sglang"]["gpus"]
    return 1 if extract_cfg["device"].startswith("cuda") else 0


def _extract_sglang(config, model_info, aux, samples, writer, on_written, log_file) -> None:
    """Two SGLang passes (aux states, then final states): extract/sglang.py says why."""
    import torch

    from draftsmith.extract import hf as extract_hf
    from draftsmith.extract import sglang as capture

    extract_cfg = config["extract"]
    batches = list(extract_hf.batches(samples, extract_cfg["batch_tokens"]))
    passes: dict[str, list] = {}
    for mode in (capture.CaptureMode.AUX, capture.CaptureMode.FINAL):
        server_log = Path(log_file or writer.directory / "extract").with_suffix(f".sglang-{mode}.log")
        with capture.SGLangCapture(
            model_info["hf_dir"], extract_cfg["sglang"], aux, mode=mode, log_path=server_log
        ) as server:
            passes[mode] = [a for batch in batches for a in server.capture([s.input_ids for s in batch])]
    ordered = [s for batch in batches for s in batch]
    dtype = getattr(torch, extract_cfg["dtype"] or config["model"]["dtype"])
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


# --- draft vocabulary ----------------------------------------------------------------
def build_draft_vocab(config: dict, inputs: dict, outputs: dict, log_file: str | None = None) -> dict:
    """The draft vocabulary from supervised tokens of the training split (held-out slice excluded)."""
    import numpy as np
    from safetensors.torch import save as save_tensors

    from draftsmith.draft import vocab as draft_vocab
    from draftsmith.draft.data import id_fraction

    started = time.time()
    plan = plan_for(config)
    train = config["train"]
    size, val_fraction = train["draft_vocab_size"], train["val_fraction"]
    vocab_size = read_model_info(Path(inputs["model"]).parent)["vocab_size"]
    counts = np.zeros(vocab_size, dtype=np.int64)
    samples = held_out = 0
    # The fallback of `held_out_ids` (no id below the threshold: the smallest hash is held
    # out) is applied at the end, from the one sample it can concern.
    smallest: tuple[float, np.ndarray] | None = None
    for sample in atomic.read_jsonl(inputs["merged"]):
        ids = np.asarray(sample["input_ids"], dtype=np.int64)
        supervised = ids[np.asarray(sample["loss_mask"], dtype=bool)]
        if supervised.size and (supervised.min() < 0 or supervised.max() >= vocab_size):
            raise cfg.ConfigError(f"{inputs['merged']}: sample {sample['id']} has ids outside the vocabulary")
        samples += 1
        fraction = id_fraction(sample["id"])
        if fraction < val_fraction:
            held_out += 1
            continue
        own = np.bincount(supervised, minlength=vocab_size)
        counts += own
        if smallest is None or fraction < smallest[0]:
            smallest = (fraction, own)
    if held_out == 0 and val_fraction > 0 and samples > 1 and smallest is not None:
        counts -= smallest[1]
        held_out = 1
    counter = draft_vocab.Counter({int(t): int(counts[t]) for t in np.flatnonzero(counts)})
    if not counter:
        raise cfg.ConfigError(f"{inputs['merged']}: no supervised token in the training split")
    tensors = draft_vocab.build(counter, size, vocab_size)
    info = {
        "draft_vocab_size": size,
        "target_vocab_size": vocab_size,
        "coverage": draft_vocab.coverage(counter, tensors["t2d"]),
        "distinct_tokens": len(counter),
        "padded": max(0, size - len(counter)),
        "supervised_tokens": int(counts.sum()),
        "train_samples": samples - held_out,
        "held_out_samples": held_out,
        "val_fraction": val_fraction,
    }
    with atomic.atomic_open(outputs["vocab"], "wb") as handle:
        handle.write(save_tensors(tensors))
    atomic.write_json(outputs["info"], info)
    manifest.write(
        outputs["manifest"],
        stage="draft_vocab",
        key=plan.draft_vocab_key,
        files=[Path(outputs["vocab"]), Path(outputs["info"])],
        params={"draft_vocab_size": size, "val_fraction": val_fraction},
        upstream={"model": plan.model_key, "merged": plan.merged_key},
        stats=info,
        started=started,
    )
    log.info("draft vocabulary: %s", json.dumps(info))
    return info


# --- draft training ------------------------------------------------------------------
def evaluate_gpus(config: dict) -> int:
    """GPUs the evaluate job holds (also its Snakemake `gpu` resource)."""
    return 1 if config["evaluate"]["device"] == "cuda" else 0


def train_gpus(config: dict) -> int:
    """GPUs one training segment job holds (also its Snakemake `gpu` resource)."""
    train = config["train"]
    return train["gpus"] if train["device"] == "cuda" else 0


def draft_spec(config: dict, plan: Plan, model_info: dict, vocab: str) -> dict:
    """What every training process needs (JSON: torchrun ranks read it from a file)."""
    return {
        "key": plan.draft_key,
        "hf_dir": model_info["hf_dir"],
        "trust_remote_code": config["model"]["trust_remote_code"],
        "hidden_dir": str(plan.hidden_dir),
        "shard_names": plan.shard_names,
        "vocab": str(vocab),
        "train": dict(config["train"]),
    }


def _segment_record(staged: Path, segment: str) -> Path:
    return staged / f"segment-{segment}.json"


def _reuse_staged_segment(
    staged: Path, segment: str, key: str, previous_sha: str | None, outputs: dict
) -> bool:
    """Link a segment an earlier run finished (and verified) into the declared outputs.

    As for shards: a kill between the last write and Snakemake's bookkeeping makes a
    finished segment look incomplete, and Snakemake deletes a job's outputs before
    rerunning it, so segments are written under `.staged/` and hard-linked into place.
    """
    from draftsmith.hashing import sha256_file

    record_path = _segment_record(staged, segment)
    try:
        record = json.loads(record_path.read_text())
    except (OSError, ValueError):
        return False
    if record.get("key") != key or record.get("previous_sha256") != previous_sha:
        return False
    for name, expected in record["files"].items():
        path = staged / name
        if (
            not path.exists()
            or path.stat().st_size != expected["size"]
            or sha256_file(path) != expected["sha256"]
        ):
            return False
    _link_segment(staged, outputs)
    log.info("segment %s: reusing the verified checkpoint finished by an earlier run", segment)
    return True


def _link_segment(staged: Path, outputs: dict) -> None:
    for declared in (outputs["checkpoint"], outputs["metrics"]):
        Path(declared).unlink(missing_ok=True)
        os.link(staged / Path(declared).name, declared)
    atomic.fsync_dir(Path(outputs["checkpoint"]).parent)


def train_segment(
    config: dict, segment: int, inputs: dict, outputs: dict, log_file: str | None = None
) -> dict:
    """One checkpoint segment of draft training (rule `train_segment`)."""
    from draftsmith import gpus
    from draftsmith.draft import train
    from draftsmith.hashing import sha256_file

    plan = plan_for(config)
    name = f"{segment:05d}"
    previous = inputs.get("previous") or None
    if isinstance(previous, list | tuple):
        previous = previous[0] if previous else None
    previous_sha = sha256_file(Path(previous)) if previous else None
    out = Path(outputs["checkpoint"]).parent
    staged = out / STAGED
    if _reuse_staged_segment(staged, name, plan.draft_key, previous_sha, outputs):
        return {"segment": segment, "reused": True}
    staged.mkdir(parents=True, exist_ok=True)
    _segment_record(staged, name).unlink(missing_ok=True)
    model_info = read_model_info(Path(inputs["model"]).parent)
    spec = draft_spec(config, plan, model_info, inputs["vocab"])
    ckpt, metrics = staged / Path(outputs["checkpoint"]).name, staged / Path(outputs["metrics"]).name
    threads = int(os.environ.get("OMP_NUM_THREADS") or os.cpu_count() or 1)
    with gpus.acquire_gpus(train_gpus(config)):
        train.launch(
            spec, segment, previous, ckpt, metrics, world_size=config["train"]["gpus"], threads=threads
        )
    files = {p.name: {"sha256": sha256_file(p), "size": p.stat().st_size} for p in (ckpt, metrics)}
    atomic.write_json(
        _segment_record(staged, name),
        {"key": plan.draft_key, "segment": segment, "previous_sha256": previous_sha, "files": files},
    )
    _link_segment(staged, outputs)
    return {"segment": segment, "reused": False}


def _train_summary(
    config: dict, state: dict, metrics_files: list[str], vocab_info: dict, layers: dict
) -> dict:
    from draftsmith.draft.model import STEP_DECAY

    records = [r for path in metrics_files for r in atomic.read_jsonl(path)]
    train_records = [r for r in records if r["kind"] == "train"]
    val_records = [r for r in records if r["kind"] == "val"]
    steps = config["train"]["ttt_steps"]
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


def finish_training(config: dict, inputs: dict, outputs: dict, log_file: str | None = None) -> dict:
    """Rule `train`: the trained weights (SGLang names, no embedding), config and summary."""
    import torch
    from safetensors.torch import save as save_tensors

    started = time.time()
    plan = plan_for(config)
    state = torch.load(inputs["checkpoint"], map_location="cpu", weights_only=True)
    if state["key"] != plan.draft_key or state["step"] != config["train"]["total_steps"]:
        raise cfg.ConfigError(
            f"{inputs['checkpoint']}: draft {state['key']} at step {state['step']}, expected "
            f"{plan.draft_key} at step {config['train']['total_steps']}"
        )
    tensors = {name: t.contiguous() for name, t in state["model"].items()}
    with atomic.atomic_open(outputs["weights"], "wb") as handle:
        handle.write(save_tensors(tensors, metadata={"format": "pt"}))  # one entry: deterministic bytes
    atomic.write_json(outputs["config"], state["draft_config"])
    layers = json.loads(Path(inputs["shard"]).read_text())["meta"]["layers"]
    summary = _train_summary(
        config, state, list(inputs["metrics"]), json.loads(Path(inputs["vocab_info"]).read_text()), layers
    )
    atomic.write_json(outputs["summary"], summary)
    manifest.write(
        outputs["manifest"],
        stage="draft",
        key=plan.draft_key,
        files=[Path(outputs["weights"]), Path(outputs["config"]), Path(outputs["summary"])],
        params=plan.train_params(),
        upstream={"model": plan.model_key, "hidden": plan.hidden_key, "draft_vocab": plan.draft_vocab_key},
        stats={k: summary[k] for k in ("steps", "tokens_seen", "samples_seen", "wall_s")}
        | {"end": summary["end"]},
        started=started,
    )
    log.info("draft %s: %s", plan.draft_key, json.dumps(summary["end"]))
    return summary


# --- export ----------------------------------------------------------------------------
def export_draft(config: dict, inputs: dict, outputs: dict, log_file: str | None = None) -> dict:
    """Rule `export`: the draft in SGLang and vLLM speculators formats, each validated by
    reloading (keys, shapes, context, layer-id convention, logits) before it counts."""
    from draftsmith.draft import export, train
    from draftsmith.layers import AuxLayers

    started = time.time()
    plan = plan_for(config)
    settings = plan.export_params()
    model_info = read_model_info(Path(inputs["model"]).parent)
    hf_dir = Path(model_info["hf_dir"])
    _, weights = train.load_target(hf_dir, config["model"]["trust_remote_code"])
    draft = export.load_trained_draft(Path(inputs["weights"]), Path(inputs["config"]), weights["embed"])
    aux = AuxLayers.from_manifest(json.loads(Path(inputs["shard"]).read_text())["meta"]["layers"])
    target_config = json.loads((hf_dir / "config.json").read_text())
    common = {
        "aux": aux,
        "target_config": target_config,
        "serving_context": settings["serving_context"],
        "dtype": settings["dtype"],
    }
    manifests = {
        export.SGLANG: export.export_sglang(
            draft,
            Path(outputs["sglang_config"]).parent,
            allow_ambiguous_sglang_ids=settings["allow_ambiguous_sglang_ids"],
            **common,
        ),
        export.VLLM: export.export_vllm(
            draft,
            Path(outputs["vllm_config"]).parent,
            verifier_name_or_path=settings["verifier_name_or_path"] or str(hf_dir),
            speculative_tokens=settings["speculative_tokens"],
            **common,
        ),
    }
    out = Path(outputs["manifest"]).parent
    manifest.write(
        outputs["manifest"],
        stage="export",
        key=plan.export_key,
        files=[Path(outputs[name]) for name in outputs if name != "manifest"],
        params=settings,
        upstream={"draft": plan.draft_key},
        stats={fmt: m["validation"] for fmt, m in manifests.items()},
        started=started,
    )
    log.info("export %s: %s and %s validated", plan.export_key, out / "sglang", out / "vllm")
    return manifests
