"""Rule `export`: the draft in SGLang and vLLM speculators formats, each validated by
reloading (keys, shapes, context, layer-id convention, logits) before it counts."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from draftsmith.export.load import load_trained_draft
from draftsmith.export.names import SGLANG, VLLM
from draftsmith.export.settings import ExportSettings
from draftsmith.export.write import export_sglang, export_vllm
from draftsmith.store import manifest
from draftsmith.store.plan import Artifact
from draftsmith.target.layers import AuxLayers
from draftsmith.target.load import hf_config, load_target, model_info

log = logging.getLogger(__name__)


def export(
    settings: ExportSettings, artifact: Artifact, inputs: dict, outputs: dict, log_file: str | None = None
) -> dict:
    started = time.time()
    hf_dir = Path(model_info(inputs["model"])["hf_dir"])
    _, weights = load_target(hf_dir, settings.trust_remote_code)
    draft = load_trained_draft(Path(inputs["weights"]), Path(inputs["config"]), weights["embed"])
    aux = AuxLayers.from_manifest(json.loads(Path(inputs["shard"]).read_text())["meta"]["layers"])
    common = {
        "aux": aux,
        "target_config": hf_config(hf_dir),
        "serving_context": settings.serving_context,
        "dtype": settings.dtype,
    }
    records = {
        SGLANG: export_sglang(
            draft,
            Path(outputs["sglang_config"]).parent,
            allow_ambiguous_sglang_ids=settings.allow_ambiguous_sglang_ids,
            **common,
        ),
        VLLM: export_vllm(
            draft,
            Path(outputs["vllm_config"]).parent,
            verifier_name_or_path=settings.verifier_name_or_path or str(hf_dir),
            speculative_tokens=settings.speculative_tokens,
            **common,
        ),
    }
    files = [outputs[role] for role in outputs if role != "manifest"]
    manifest.write(
        artifact, outputs["manifest"], files, {fmt: r["validation"] for fmt, r in records.items()}, started
    )
    log.info("export %s: %s and %s validated", artifact.key, outputs["sglang_config"], outputs["vllm_config"])
    return records
