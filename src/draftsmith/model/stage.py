"""Rule `model`: fetch and convert the target once, record its shapes and special tokens."""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from draftsmith.errors import ModelError
from draftsmith.fsutil import atomic
from draftsmith.model.settings import ModelSettings
from draftsmith.model.source import convert_gguf, fetch_gguf
from draftsmith.store import manifest
from draftsmith.store.plan import Artifact
from draftsmith.target import special_tokens
from draftsmith.target.load import load_model, load_tokenizer


def model(
    settings: ModelSettings, artifact: Artifact, inputs: dict, outputs: dict, log_file: str | None = None
) -> dict:
    """Fetch/convert the target and record its special tokens in model.json."""
    started = time.time()
    source = settings.source
    files: list[Path] = []
    if source.kind == "hf_dir":
        hf_dir = Path(source.path).resolve()
        if not (hf_dir / "config.json").is_file():
            raise ModelError(f"model.source.path: no config.json in {hf_dir}")
    else:
        hf_dir = Path(outputs["hf"])
        # The download lands in the artifact's directory under an owned temp name: after
        # a kill -9 the rerun (or `draftsmith gc`) removes it.
        download = Path(tempfile.mkdtemp(prefix=atomic.temp_prefix("gguf"), dir=hf_dir.parent))
        try:
            convert_gguf(fetch_gguf(source, download), hf_dir, settings.dtype)
        finally:
            shutil.rmtree(download, ignore_errors=True)
        files.append(hf_dir)
    info = describe(
        hf_dir,
        dtype=settings.dtype,
        trust_remote_code=settings.trust_remote_code,
        probe_generation=settings.probe_generation,
        end_of_turn_ids=settings.end_of_turn_ids,
    )
    if source.kind != "hf_dir":
        info["hf_dir"] = hf_dir.name  # inside the store: relative to model.json (see model_info)
    atomic.write_json(outputs["info"], info)
    files.append(Path(outputs["info"]))
    stats = {"num_hidden_layers": info["num_hidden_layers"], "vocab_size": info["vocab_size"]}
    manifest.write(artifact, outputs["manifest"], files, stats, started)
    return info


def describe(
    hf_dir: Path,
    *,
    dtype: str,
    trust_remote_code: bool,
    probe_generation: bool,
    end_of_turn_ids: Sequence[int] | None = None,
) -> dict:
    """What later stages need to know of the target, without loading it again; with
    `end_of_turn_ids`, refuses a chat template that ends a turn otherwise."""
    from transformers import AutoConfig, GenerationConfig

    tokenizer = load_tokenizer(hf_dir, trust_remote_code)
    hf_config = AutoConfig.from_pretrained(hf_dir, trust_remote_code=trust_remote_code)
    text_config = hf_config.get_text_config()
    try:
        stop_ids = GenerationConfig.from_pretrained(hf_dir).eos_token_id
    except OSError:
        stop_ids = hf_config.eos_token_id
    probe = load_model(hf_dir, dtype, trust_remote_code=trust_remote_code) if probe_generation else None
    configured = None if end_of_turn_ids is None else list(end_of_turn_ids)
    tokens = special_tokens.inspect(tokenizer, stop_ids, configured, probe)
    return {
        "hf_dir": str(hf_dir),
        "architectures": hf_config.architectures,
        "model_type": hf_config.model_type,
        "num_hidden_layers": text_config.num_hidden_layers,
        "hidden_size": text_config.hidden_size,
        "vocab_size": text_config.vocab_size,
        "max_position_embeddings": getattr(text_config, "max_position_embeddings", None),
        "dtype": dtype,
        "special_tokens": tokens,
    }
