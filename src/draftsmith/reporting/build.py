"""Rule `report`: every figure, the benchmark summary, and HTML pages of the reports."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from draftsmith import atomic
from draftsmith.reporting import plots
from draftsmith.reporting.markdown import to_html
from draftsmith.reporting.summary import benchmark_markdown

log = logging.getLogger("draftsmith.reporting")


def _json(path: str) -> dict:
    return json.loads(Path(path).read_text())


def read_metrics(paths: list[str]) -> list[dict]:
    """Every record of every training segment, in segment order."""
    return [record for path in paths for record in atomic.read_jsonl(path)]


def build_report(config: dict, inputs: dict, outputs: dict, log_file: str | None = None) -> dict:
    experiment = config["experiment"]
    data_report = _json(inputs["data_report"])
    plan_report = _json(inputs["plan_report"])
    train_summary = _json(inputs["train_summary"])
    benchmark = _json(inputs["benchmark"])
    if not benchmark["prompt_sets"]:
        raise ValueError(f"{inputs['benchmark']}: no prompt sets, nothing to report")
    records = read_metrics(list(inputs["metrics"]))

    plots.acceptance_length(benchmark, outputs["acceptance_length"])
    plots.acceptance_per_position(benchmark, outputs["acceptance_per_position"])
    plots.throughput(benchmark, outputs["throughput"])
    plots.training_loss(records, outputs["training_loss"])
    plots.training_accuracy(records, outputs["training_accuracy"])
    plots.data_report(data_report, outputs["data_plot"])

    summary = benchmark_markdown(experiment, data_report, plan_report, train_summary, benchmark)
    atomic.write_text(outputs["summary"], summary)
    pages = {
        "summary_html": (summary, f"Benchmark report: {experiment}"),
        "data_report_html": (Path(inputs["data_report_md"]).read_text(), f"Data report: {experiment}"),
        "plan_report_html": (Path(inputs["plan_report_md"]).read_text(), f"Extraction plan: {experiment}"),
    }
    for name, (markdown, title) in pages.items():
        atomic.write_text(outputs[name], to_html(markdown, title))
    log.info("report for %s: %s", experiment, ", ".join(sorted(outputs.values())))
    return {"lossless": benchmark["lossless"], "outputs": sorted(outputs.values())}
