"""Rule `merged`: the selected datasets capped, shuffled by seed, plus the data report."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from draftsmith.fsutil import atomic
from draftsmith.merged import data_report
from draftsmith.merged.merge import merge
from draftsmith.merged.settings import MergedSettings
from draftsmith.store import manifest
from draftsmith.store.layout import MANIFEST
from draftsmith.store.plan import Artifact

log = logging.getLogger(__name__)


def merged(
    settings: MergedSettings, artifact: Artifact, inputs: dict, outputs: dict, log_file: str | None = None
) -> dict:
    """`inputs` tokens and responses: one file per merged dataset, in `settings.datasets` order."""
    started = time.time()
    datasets = settings.datasets
    tokens = dict(zip(datasets, inputs["tokens"], strict=True))
    responses = dict(zip(datasets, inputs["responses"], strict=True))
    per_dataset = {name: list(atomic.read_jsonl(path)) for name, path in tokens.items()}
    samples, taken = merge(per_dataset, dict(settings.caps), settings.seed)
    atomic.write_jsonl(outputs["train"], samples)
    rows = [
        data_report.dataset_row(
            name,
            manifest.read(Path(responses[name]).parent / MANIFEST)["stats"],
            manifest.read(Path(tokens[name]).parent / MANIFEST)["stats"],
            taken[name],
        )
        for name in sorted(tokens)
    ]
    report = {
        "experiment": settings.experiment,
        "key": artifact.key,
        "seed": settings.seed,
        "max_length": settings.max_length,
        "excluded": list(settings.excluded),
        "datasets": rows,
        "total": data_report.totals(rows),
    }
    atomic.write_json(outputs["report"], report)
    atomic.write_text(outputs["report_md"], data_report.markdown(report))
    stats = {
        "samples": len(samples),
        "tokens": sum(len(s["input_ids"]) for s in samples),
        "per_dataset": taken,
    }
    files = [outputs[role] for role in ("train", "report", "report_md")]
    manifest.write(artifact, outputs["manifest"], files, stats, started)
    log.info("merged %d samples from %d datasets", len(samples), len(tokens))
    return report
