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
