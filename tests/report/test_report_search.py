"""The settings search in the run's report: its table and recommended launch beside the
evaluation, and the serving benchmark's verdict on it when the serving benchmark ran."""

from __future__ import annotations

import json
from pathlib import Path

from report.test_report import fixture_benchmark, fixture_data_report, rule_outputs, write_inputs
from search.test_summary import COMMAND, fixture_search, verdict

from draftsmith.report.settings import ReportSettings
from draftsmith.report.stage import report as build_report


def _report(tmp_path: Path, serving: dict | None) -> str:
    """benchmark.md of a run with the search (and, given `serving`, a serving benchmark)."""
    inputs = write_inputs(tmp_path / "in", fixture_benchmark(), fixture_data_report())
    search = tmp_path / "in" / "search.json"
    search.write_text(json.dumps(fixture_search()))
    inputs["search"] = [str(search)]
    if serving is not None:
        served = tmp_path / "in" / "serve_benchmark.json"
        served.write_text(json.dumps(serving))
        md = tmp_path / "in" / "serve_benchmark.md"
        md.write_text("# Serving benchmark: test\n")
        inputs |= {"serve_benchmark": [str(md)], "serve_benchmark_json": [str(served)]}
    outputs = rule_outputs(tmp_path / "results")
    build_report(ReportSettings(experiment="test"), inputs, outputs)
    assert "Settings search" in Path(outputs["summary_html"]).read_text()
    return Path(outputs["summary"]).read_text()


def test_the_search_section_follows_the_evaluation(tmp_path):
    summary = _report(tmp_path, serving=None)
    search = fixture_search()
    evaluation = summary.index("## Recommended SGLang settings")
    assert summary.index("## Settings search (prompt set `heldout`)") > evaluation
    assert "| 1 | tree 3/2/6 | 2 | 2 | 1.50 | 67.2 | 48.0 | 1.40x |" in summary
    assert "### Recommended by the search" in summary and f"`{search['recommended']['command']}`" in summary
    assert "serving benchmark:**" not in summary


def test_the_serving_verdict_reads_beside_the_recommendation(tmp_path):
    summary = _report(tmp_path, serving={"settings": [], "search": verdict("k=3")})
    part = summary.split("### Recommended by the search", 1)[1].split("## Serving benchmark", 1)[0]
    assert "**Not confirmed by the serving benchmark:** k=3, not tree 3/2/6, is the fastest" in part
    assert f"`{COMMAND.format(3, 1, 4)}`" in part
    confirmed = _report(tmp_path, serving={"settings": [], "search": verdict("tree 3/2/6")})
    assert "**Confirmed by the serving benchmark:** tree 3/2/6" in confirmed


def test_a_serving_run_without_the_search_settings_gives_no_verdict(tmp_path):
    summary = _report(tmp_path, serving={"settings": []})  # search.confirm_top 0
    assert "## Settings search" in summary and "by the serving benchmark" not in summary
