"""Rule `report`: every figure, the benchmark summary, and HTML pages of the reports."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from draftsmith.formats.markdown import to_html
from draftsmith.fsutil import atomic
from draftsmith.report import plots
from draftsmith.report.settings import ReportSettings
from draftsmith.report.summary import benchmark_markdown
from draftsmith.runtime.jobs import optional_input
from draftsmith.search import search_markdown

log = logging.getLogger(__name__)

NO_EVALUATION = "no built-in evaluation in this config\n(evaluate.enabled: false);\nsee the serving benchmark"


def _json(path: str) -> dict:
    return json.loads(Path(path).read_text())


def read_metrics(paths: list[str]) -> list[dict]:
    """Every record of every training segment, in segment order."""
    return [record for path in paths for record in atomic.read_jsonl(path)]


def search_section(inputs: dict) -> str | None:
    """The settings search's section, with the serving benchmark's verdict on its
    recommendation when that served the search's settings (None: no search ran)."""
    search_path = optional_input(inputs.get("search"))
    if search_path is None:
        return None
    serving_path = optional_input(inputs.get("serve_benchmark_json"))
    verdict = _json(serving_path).get("search") if serving_path else None
    return search_markdown(_json(search_path), verdict)


def report(settings: ReportSettings, inputs: dict, outputs: dict, log_file: str | None = None) -> dict:
    """Rule `report`; results/ holds no keyed artifact, so the job gets no `artifact`."""
    experiment = settings.experiment
    data_report = _json(inputs["data_report"])
    estimate = _json(inputs["estimate"])
    train_summary = _json(inputs["train_summary"])
    benchmark_path = optional_input(inputs.get("benchmark"))
    benchmark = _json(benchmark_path) if benchmark_path else None
    if benchmark is not None and not benchmark["prompt_sets"]:
        raise ValueError(f"{benchmark_path}: no prompt sets, nothing to report")
    serving_path = optional_input(inputs.get("serve_benchmark"))
    serving = Path(serving_path).read_text() if serving_path else None
    records = read_metrics(list(inputs["metrics"]))

    if benchmark is not None:
        plots.acceptance_length(benchmark, outputs["acceptance_length"])
        plots.acceptance_per_position(benchmark, outputs["acceptance_per_position"])
        plots.throughput(benchmark, outputs["throughput"])
    else:
        for name in ("acceptance_length", "acceptance_per_position", "throughput"):
            plots.not_measured(outputs[name], name.replace("_", " "), NO_EVALUATION)
    plots.training_loss(records, outputs["training_loss"])
    plots.training_accuracy(records, outputs["training_accuracy"])
    plots.data_report(data_report, outputs["data_plot"])

    summary = benchmark_markdown(
        experiment, data_report, estimate, train_summary, benchmark, serving, search_section(inputs)
    )
    atomic.write_text(outputs["summary"], summary)
    pages = {
        "summary_html": (summary, f"Benchmark report: {experiment}"),
        "data_report_html": (Path(inputs["data_report_md"]).read_text(), f"Data report: {experiment}"),
        "estimate_html": (Path(inputs["estimate_md"]).read_text(), f"Hidden-state estimate: {experiment}"),
    }
    for name, (markdown, title) in pages.items():
        atomic.write_text(outputs[name], to_html(markdown, title))
    log.info("report for %s: %s", experiment, ", ".join(sorted(outputs.values())))
    return {"lossless": benchmark["lossless"] if benchmark else None, "outputs": sorted(outputs.values())}
