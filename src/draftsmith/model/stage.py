"""Rule `model`: fetch and convert the target once, record its shapes and special tokens."""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

from draftsmith.errors import ModelError
from draftsmith.fsutil import atomic
from draftsmith.model.source import convert_gguf, fetch_gguf
from draftsmith.store import manifest
from draftsmith.store.plan import plan_for
from draftsmith.target import special_tokens
from draftsmith.target.load import load_model, load_tokenizer


def model(config: dict, inputs: dict, outputs: dict, log_file: str | None = None) -> dict:
    """Fetch/convert the target and record its special tokens in model.json."""
    started = time.time()
    artifact = plan_for(config).model
    model_cfg = config["model"]
    source = model_cfg["source"]
    files: list[Path] = []
    if source["kind"] == "hf_dir":
        hf_dir = Path(source["path"]).resolve()
        if not (hf_dir / "config.json").is_file():
            raise ModelError(f"model.source.path: no config.json in {hf_dir}")
    else:
        hf_dir = Path(outputs["hf"])
        # The download lands in the artifact's directory under an owned temp name: after
        # a kill -9 the rerun (or `draftsmith gc`) removes it.
        download = Path(tempfile.mkdtemp(prefix=atomic.temp_prefix("gguf"), dir=hf_dir.parent))
        try:
            convert_gguf(fetch_gguf(source, download), hf_dir, model_cfg["dtype"])
        finally:
            shutil.rmtree(download, ignore_errors=True)
        files.append(hf_dir)
    info = describe(hf_dir, model_cfg)
    if source["kind"] != "hf_dir":
        info["hf_dir"] = hf_dir.name  # inside the store: relative to model.json (see model_info)
    atomic.write_json(outputs["info"], info)
    files.append(Path(outputs["info"]))
    stats = {"num_hidden_layers": info["num_hidden_layers"], "vocab_size": info["vocab_size"]}
    manifest.write(artifact, outputs["manifest"], files, stats, started)
    return info


def describe(hf_dir: Path, model_cfg: dict) -> dict:
    """What later stages need to know of the target, without loading it again."""
    from transformers import AutoConfig, GenerationConfig

    trust = model_cfg["trust_remote_code"]
    tokenizer = load_tokenizer(hf_dir, trust)
    hf_config = AutoConfig.from_pretrained(hf_dir, trust_remote_code=trust)
    text_config = hf_config.get_text_config()
    try:
        stop_ids = GenerationConfig.from_pretrained(hf_dir).eos_token_id
    except OSError:
        stop_ids = hf_config.eos_token_id
    probe = (
        load_model(hf_dir, model_cfg["dtype"], trust_remote_code=trust)
        if model_cfg["probe_generation"]
        else None
    )
    tokens = special_tokens.inspect(tokenizer, stop_ids, model_cfg.get("end_of_turn_ids"), probe)
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
