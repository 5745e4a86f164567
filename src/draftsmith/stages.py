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
            config["model"]["dtype"],
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
    samples, stats = tokenize_records(atomic.read_jsonl(inputs["responses"]), chat, dataset)
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
        return extract_cfg["sglang"].get("gpus", 1)
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
