"""draftsmith.reporting: figures, the benchmark summary, HTML pages, rule `report` and the HTML report.

The benchmark input comes from rule `evaluate`; here it is a fixture in that rule's fixed
schema (`fixture_benchmark`). The other inputs are built with the real report helpers
(`draftsmith.merged.data_report`, `draftsmith.hidden.estimate`) or mirror the real records field for field.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
import yaml
from conftest import REPO, snakemake, snakemake_cmd, workflow_config, write_rows
from matplotlib.image import imread
from search.test_summary import fixture_search

from draftsmith import config as cfg
from draftsmith.evaluate.length import long_context
from draftsmith.evaluate.sets import by_set
from draftsmith.formats.markdown import to_html
from draftsmith.fsutil import atomic
from draftsmith.hidden import estimate
from draftsmith.merged import data_report as report
from draftsmith.report import plots
from draftsmith.report.settings import ReportSettings
from draftsmith.report.stage import report as build_report
from draftsmith.report.summary import benchmark_markdown
from draftsmith.report.workflow import report_command
from draftsmith.store.plan import plan_for

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# What the evaluator records of the draft's context (`evaluate.stage.draft_context`).
DRAFT = {"training_max_length": 256, "max_position_embeddings": 8192, "rope_scaling": None}
FIGURES = {
    "acceptance_length": lambda inputs, path: plots.acceptance_length(inputs["benchmark"], path),
    "acceptance_per_position": lambda inputs, path: plots.acceptance_per_position(inputs["benchmark"], path),
    "throughput": lambda inputs, path: plots.throughput(inputs["benchmark"], path),
    "training_loss": lambda inputs, path: plots.training_loss(inputs["records"], path),
    "training_accuracy": lambda inputs, path: plots.training_accuracy(inputs["records"], path),
    "data": lambda inputs, path: plots.data_report(inputs["data_report"], path),
}


# --- test inputs ---------------------------------------------------------------------
def fixture_benchmark(lossless: bool = True) -> dict:
    """A test input in rule `evaluate`'s benchmark.json schema: two prompt sets, k = 1..3 and
    two trees; tree 3/2/6 is fastest in `chat` (2.60x), k=3 in `code` (1.70x), the tree on the
    mean (2.05x against k=3's 2.00x)."""

    def result(k: int, accept: float) -> dict:
        per_position = [round(accept**j, 4) for j in range(1, k + 1)]
        length = 1 + sum(per_position)
        seconds = round(8.0 / length * 1.1, 3)
        return {
            "acceptance_length": length,
            "acceptance_length_range": [round(length - 0.25, 4), round(length + 0.5, 4)],
            "acceptance_rate": round(sum(per_position) / k, 4),
            "per_position": per_position,
            "verify_steps": round(96 / length),
            "tokens": 96,
            "seconds": seconds,
            "tokens_per_s": round(96 / seconds, 3),
            "speedup": round(8.0 / seconds, 4),
        }

    def tree(num_steps: int, topk: int, num_draft_tokens: int, speedup: float) -> dict:
        per_depth = [round(0.8**d, 4) for d in range(1, num_steps + 1)]
        seconds = round(8.0 / speedup, 3)
        return {
            "num_steps": num_steps,
            "topk": topk,
            "num_draft_tokens": num_draft_tokens,
            "acceptance_length": 1 + sum(per_depth),
            "acceptance_length_range": [round(sum(per_depth), 4), round(1.5 + sum(per_depth), 4)],
            "per_depth": per_depth,
            "verify_steps": round(96 / (1 + sum(per_depth))),
            "tokens": 96,
            "seconds": seconds,
            "tokens_per_s": round(96 / seconds, 3),
            "speedup": speedup,
        }

    def by_length(prompts: int, results: dict[str, dict]) -> list[dict]:
        """All prompts but one under 512 tokens, at each setting's AL; one 2k-8k at 90% of it."""

        def bucket(label: str, low: int, high: int, count: int, share: float) -> dict:
            return {
                "bucket": label,
                "min_tokens": low,
                "max_tokens": high,
                "prompts": count,
                "settings": {name: share * r["acceptance_length"] for name, r in results.items()},
                "verify_steps": {name: r["verify_steps"] * count // prompts for name, r in results.items()},
            }

        return [bucket("<512", 0, 511, prompts - 1, 1.0), bucket("2k-8k", 2048, 8191, 1, 0.9)]

    def prompt_set(prompts: int, accept: float, tree_speedups: tuple[float, float]) -> dict:
        by_k = {str(k): result(k, accept) for k in (1, 2, 3)}
        by_tree = {"3-2-6": tree(3, 2, 6, tree_speedups[0]), "4-4-8": tree(4, 4, 8, tree_speedups[1])}
        labelled = {f"k={k}": r for k, r in by_k.items()}
        labelled |= {f"tree {key.replace('-', '/')}": r for key, r in by_tree.items()}
        return {
            "prompts": prompts,
            "baseline": {"tokens": 96, "seconds": 8.0, "tokens_per_s": 12.0},
            "by_k": by_k,
            "by_tree": by_tree,
            "by_length": by_length(prompts, labelled),
            "draft_vocab_coverage": 0.9375,
        }

    flags = ["--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3"]
    flags += ["--speculative-eagle-topk", "2", "--speculative-num-draft-tokens", "6"]
    recommended = {
        "setting": "tree 3/2/6",
        "num_steps": 3,
        "topk": 2,
        "num_draft_tokens": 6,
        "mean_speedup": 2.05,
        "flags": flags,
        "command": 'python3 -m sglang.launch_server --model-path "$TARGET_MODEL" --host 127.0.0.1 '
        '--port 30000 --tp-size 1 --speculative-algorithm EAGLE3 --speculative-draft-model-path "$DRAFT_DIR" '
        "--speculative-num-steps 3 --speculative-eagle-topk 2 --speculative-num-draft-tokens 6",
        "placeholders": {"TARGET_MODEL": "/models/target", "DRAFT_DIR": "artifacts/export/0123/sglang"},
        "checked_by_sglang": False,
    }

    prompt_sets = {"chat": prompt_set(3, 0.7, (2.6, 1.2)), "code": prompt_set(2, 0.5, (1.5, 1.0))}
    return {
        "key": "0123456789abcdef",
        "device": "cpu",
        "dtype": "float32",
        "max_new_tokens": 32,
        "k": [1, 2, 3],
        "trees": [
            {"num_steps": 3, "topk": 2, "num_draft_tokens": 6},
            {"num_steps": 4, "topk": 4, "num_draft_tokens": 8},
        ],
        "wall_s": 41.25,
        "lossless": lossless,
        "prompt_sets": prompt_sets,
        "recommended": recommended,
        "long_context": long_context(prompt_sets, recommended, 0.8, DRAFT),
        "by_set": by_set(prompt_sets, recommended["setting"], 0.85),
    }


def fixture_data_report(costs: tuple[float, float] = (0.0, 0.0)) -> dict:
    """A data report built by draftsmith.merged.data_report from per-stage counts, as rule `merge` does."""
    rows = [
        report.dataset_row(
            name,
            {"rows": 12, "bad_rows": bad, "samples": 10, "completion_tokens": 300 + i, "cost_usd": cost},
            {
                "tokens": 1000 + 100 * i,
                "supervised_tokens": 300 + i,
                "truncated": 0,
                "dropped_no_supervised": 0,
                "with_backend_ids": 10,
                "roundtrip_mismatch_rate": 0.1,
                "prompts_with_special_text": 0,
                "replies_with_special_text": i,
            },
            merged=10,
        )
        for i, (name, bad, cost) in enumerate(zip(["alpha", "beta"], [0, 2], costs, strict=True))
    ]
    return {
        "datasets": rows,
        "total": report.totals(rows),
        "excluded": [],
        "experiment": "test",
        "key": "fedcba9876543210",
        "seed": 0,
        "max_length": 256,
    }


def fixture_estimate() -> dict:
    assignment = {
        "num_tokens": 2560,
        "num_samples": 24,
        "stored_samples": 4,
        "to_extract": {
            "shard-a": {"samples": 10, "tokens": 1024},
            "shard-b": {"samples": 10, "tokens": 1024},
        },
        "extract_tokens": 2048,
    }
    return estimate.estimate(assignment, 64, "float32", Path("."), storage_mode="raw", throughput_tok_s=None)


def fixture_metrics(segments: int = 2, steps: int = 4, positions: int = 3) -> list[list[dict]]:
    """Per segment, the records train_segment writes: one per step, then one validation."""
    out = []
    for segment in range(segments):
        records = []
        for step in range(segment * steps + 1, (segment + 1) * steps + 1):
            loss_pos = [round(10 / step + j, 4) for j in range(positions)]
            acc_pos = [round(min(0.05 * step / (j + 1), 1), 4) for j in range(positions)]
            records.append(
                {
                    "kind": "train",
                    "step": step,
                    "epoch": step / steps,
                    "loss": sum(0.8**j * x for j, x in enumerate(loss_pos)),
                    "loss_pos": loss_pos,
                    "acc_pos": acc_pos,
                    "count_pos": [200] * positions,
                    "lr": 1e-3,
                    "grad_norm": 3.0,
                    "tokens": 300,
                    "samples": 4,
                    "tok_s": 500.0,
                    "time_s": 0.6,
                }
            )
        last = records[-1]
        val = {k: last[k] for k in ("step", "loss", "loss_pos", "acc_pos", "count_pos")}
        records.append({"kind": "val", **val, "tokens": 120, "samples": 2})
        out.append(records)
    return out


def fixture_train_summary(segments: list[list[dict]]) -> dict:
    """train_summary.json's fields that the report reads (the real one has more)."""
    train = [r for records in segments for r in records if r["kind"] == "train"]
    val = [r for records in segments for r in records if r["kind"] == "val"]
    last_segment = [r["step"] for r in segments[-1] if r["kind"] == "train"]
    end_train = {k: train[-1][k] for k in ("loss", "loss_pos", "acc_pos")}
    end_train["steps"] = [last_segment[0], last_segment[-1]]
    return {
        "steps": train[-1]["step"],
        "epochs": 2.0,
        "ttt_steps": len(train[0]["loss_pos"]),
        "tokens_seen": sum(r["tokens"] for r in train),
        "samples_seen": sum(r["samples"] for r in train),
        "wall_s": 4.8,
        "tok_s": 500.0,
        "end": {"train": end_train, "val": val[-1]},
    }


def write_inputs(directory: Path, benchmark: dict, data_report: dict, segments: int = 2) -> dict:
    """Every input of rule `report` as files, keyed as the rule names them."""
    segments = fixture_metrics(segments)
    metrics = [directory / f"metrics-{i:05d}.jsonl" for i in range(len(segments))]
    for path, records in zip(metrics, segments, strict=True):
        atomic.write_jsonl(path, records)
    estimate_figures = fixture_estimate()
    files = {
        "data_report": (directory / "data_report.json", json.dumps(data_report)),
        "data_report_md": (directory / "data_report.md", report.markdown(data_report)),
        "estimate": (directory / "hidden_estimate.json", json.dumps(estimate_figures)),
        "estimate_md": (directory / "hidden_estimate.md", estimate.markdown(estimate_figures, "test")),
        "train_summary": (directory / "train_summary.json", json.dumps(fixture_train_summary(segments))),
        "benchmark": (directory / "benchmark.json", json.dumps(benchmark)),
    }
    for path, text in files.values():
        atomic.write_text(path, text)
    return {name: str(path) for name, (path, _) in files.items()} | {"metrics": [str(p) for p in metrics]}


def rule_outputs(directory: Path) -> dict:
    """Rule `report`'s outputs under `directory` (results/<experiment>), by output name."""
    paths = {name: directory / "plots" / f"{name}.png" for name in FIGURES}
    paths["data_plot"] = paths.pop("data")
    paths |= {
        "summary": directory / "benchmark.md",
        "summary_html": directory / "benchmark.html",
        "data_report_html": directory / "data_report.html",
        "estimate_html": directory / "hidden_estimate.html",
    }
    return {name: str(path) for name, path in paths.items()}


def png_chunks(data: bytes) -> list[bytes]:
    """The chunk types of a PNG, checking each chunk's CRC."""
    assert data[:8] == PNG_SIGNATURE
    chunks, offset = [], 8
    while offset < len(data):
        length = int.from_bytes(data[offset : offset + 4], "big")
        kind = data[offset + 4 : offset + 8]
        body = data[offset + 8 : offset + 8 + length]
        crc = int.from_bytes(data[offset + 8 + length : offset + 12 + length], "big")
        assert zlib.crc32(kind + body) == crc, f"bad CRC in {kind!r}"
        chunks.append(kind)
        offset += 12 + length
    return chunks


# --- figures -------------------------------------------------------------------------
def test_every_figure_is_a_valid_png_with_stable_bytes(tmp_path):
    inputs = {
        "benchmark": fixture_benchmark(),
        "records": sum(fixture_metrics(), []),
        "data_report": fixture_data_report(),
    }
    for name, draw in FIGURES.items():
        first, second = tmp_path / f"{name}-1.png", tmp_path / f"{name}-2.png"
        draw(inputs, first)
        draw(inputs, second)
        data = first.read_bytes()
        chunks = png_chunks(data)
        assert chunks[0] == b"IHDR" and chunks[-1] == b"IEND" and b"IDAT" in chunks
        assert not {b"tEXt", b"iTXt", b"zTXt", b"tIME"} & set(chunks), f"{name}: metadata in the PNG"
        height, width, _ = imread(first).shape
        assert width >= 400 and height >= 300, name
        assert data == second.read_bytes(), f"{name}: same inputs, different bytes"
    assert not list(tmp_path.glob(".tmp-*")), "atomic writes left temp files"


def test_cost_panel_appears_only_when_a_dataset_cost_money(tmp_path):
    plots.data_report(fixture_data_report((0.0, 0.0)), tmp_path / "free.png")
    plots.data_report(fixture_data_report((0.0, 1.25)), tmp_path / "paid.png")
    free_width = imread(tmp_path / "free.png").shape[1]
    paid_width = imread(tmp_path / "paid.png").shape[1]
    assert paid_width == 2 * free_width  # a second panel of the same size


def test_one_panel_per_prompt_set(tmp_path):
    benchmark = fixture_benchmark()
    plots.throughput(benchmark, tmp_path / "two.png")
    benchmark["prompt_sets"] = {"chat": benchmark["prompt_sets"]["chat"]}
    plots.throughput(benchmark, tmp_path / "one.png")
    assert imread(tmp_path / "two.png").shape[1] == 2 * imread(tmp_path / "one.png").shape[1]


# --- the summary and HTML pages ----------------------------------------------------------
def summary_text(benchmark: dict) -> str:
    train_summary = fixture_train_summary(fixture_metrics())
    return benchmark_markdown("test", fixture_data_report(), fixture_estimate(), train_summary, benchmark)


def section(text: str, heading: str) -> str:
    """The Markdown between `## <heading>` and the next heading."""
    return text.split(f"## {heading}", 1)[1].split("\n## ", 1)[0]


def table_row(text: str, first_cell: str) -> list[str]:
    """The cells of the first table row of `text` whose first cell is `first_cell`."""
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0] == first_cell:
            return cells
    raise AssertionError(f"no row starting with {first_cell!r}")


def test_summary_holds_the_input_numbers():
    benchmark = fixture_benchmark()
    text = summary_text(benchmark)
    assert "**Lossless: yes.**" in text
    assert "device cpu, dtype float32, up to 32 new tokens" in text
    assert "k (draft tokens per verify step) in 1, 2, 3" in text
    # Data totals: 2 datasets, 24 rows, 2 bad rows, 20 merged, 2,100 tokens, 601 supervised.
    assert table_row(section(text, "Data"), "2")[:6] == ["2", "24", "2", "20", "2,100", "601"]
    # Estimate: 2 shards to extract, 24 samples of which 4 stored, 2,048 tokens to forward, raw.
    estimate_row = table_row(section(text, "Hidden-state estimate"), "2")
    stored = f"{fixture_estimate()['bytes_needed'] / 1e9:.3f} GB"
    assert estimate_row[:6] == ["2", "24", "4", "2,048", "raw", stored]
    # Training: 8 steps of 300 tokens; end figures per TTT position from the last step.
    training = section(text, "Training")
    assert table_row(training, "8")[:3] == ["8", "2.00", "2,400"]
    assert "token-weighted over steps 5-8" in training
    last = fixture_metrics()[-1][-2]
    for j in range(3):
        row = table_row(training, str(j + 1))
        assert row[1:3] == [f"{last['loss_pos'][j]:.3f}", f"{last['acc_pos'][j]:.3f}"]
    # Benchmark: one section per prompt set, one row per k with the fixture's numbers.
    for name, prompt_set in benchmark["prompt_sets"].items():
        part = section(text, f"Prompt set `{name}`")
        assert f"({prompt_set['prompts']} prompts)" in part
        assert "96 tokens in 8.00 s, 12.0 tokens/s" in part
        for k, result in prompt_set["by_k"].items():
            row = table_row(part, k)
            low, high = result["acceptance_length_range"]
            assert row[1:3] == [f"{result['acceptance_length']:.2f}", f"{low:.2f}-{high:.2f}"]
            assert row[3] == str(int(k) + 1)
            assert row[8] == f"{result['tokens_per_s']:.1f}" and row[9] == f"{result['speedup']:.2f}x"
        for result in prompt_set["by_tree"].values():
            shape = f"{result['num_steps']}/{result['topk']}/{result['num_draft_tokens']}"
            row = table_row(part, shape)
            low, high = result["acceptance_length_range"]
            assert row[1:3] == [f"{result['acceptance_length']:.2f}", f"{low:.2f}-{high:.2f}"]
            assert row[3] == str(result["num_steps"] + 1)
            assert row[4] == " / ".join(f"{p:.2f}" for p in result["per_depth"])
            assert row[7] == f"{result['tokens_per_s']:.1f}" and row[8] == f"{result['speedup']:.2f}x"
    # The best line covers both kinds: a tree wins `chat`, a chain `code`.
    best_k, best = max(benchmark["prompt_sets"]["code"]["by_k"].items(), key=lambda item: item[1]["speedup"])
    assert best["speedup"] > 1.5 and f"Best: k={best_k}, {best['speedup']:.2f}x" in section(
        text, "Prompt set `code`"
    )
    assert "Best: tree 3/2/6, 2.60x" in section(text, "Prompt set `chat`")
    assert "trees (num_steps/topk/num_draft_tokens) 3/2/6, 4/4/8" in text
    recommended = section(text, "Recommended SGLang settings")
    assert "tree 3/2/6: the best speed-up over the prompt sets, 2.05x" in recommended
    assert f"`{' '.join(benchmark['recommended']['flags'])}`" in recommended
    assert f"`{benchmark['recommended']['command']}`" in recommended
    assert "`artifacts/export/0123/sglang`" in recommended and "own argument parser: no" in recommended
    assert "No setting beat the target alone" not in recommended  # 2.05x


def test_summary_shows_acceptance_by_prompt_length_and_the_long_context_warning():
    benchmark = fixture_benchmark()
    text = summary_text(benchmark)
    assert benchmark["long_context"]["flagged"] is False and "Long-context warning" not in text
    chat = benchmark["prompt_sets"]["chat"]
    part = section(text, "Prompt set `chat`")
    labels = ["k=1", "k=2", "k=3", "tree 3/2/6", "tree 4/4/8"]
    assert table_row(part, "prompt tokens") == ["prompt tokens", "prompts", *labels]
    for bucket in chat["by_length"]:
        row = table_row(part, bucket["bucket"])
        assert row[1] == str(bucket["prompts"])
        assert row[2:] == [f"{bucket['settings'][label]:.2f}" for label in labels]
    # The recommended tree collapses on chat's long prompt: the warning leads the page.
    short = chat["by_length"][0]["settings"]["tree 3/2/6"]
    chat["by_length"][1]["settings"]["tree 3/2/6"] = 0.5 * short
    benchmark["long_context"] = long_context(benchmark["prompt_sets"], benchmark["recommended"], 0.8, DRAFT)
    text = summary_text(benchmark)
    warning = text.split("**Long-context warning:** ", 1)[1].split("\n", 1)[0]
    assert warning.startswith(
        f"prompt set `chat`, tree 3/2/6: acceptance length {0.5 * short:.2f} at 2k-8k prompt tokens "
        f"(1 prompt), 50% of {short:.2f} at <512"
    )
    assert "at most 256 tokens (tokenize.max_length); exported with max_position_embeddings 8192" in warning
    assert text.index("Long-context warning") < text.index("## Data")
    assert "<strong>Long-context warning:</strong>" in to_html(text, "Benchmark")


def test_a_lossy_benchmark_is_flagged():
    text = summary_text(fixture_benchmark(lossless=False))
    assert "**Lossless: NO.**" in text and "Lossless: yes" not in text


def test_html_pages_render_the_report_tables():
    data_report = fixture_data_report()
    data_report["datasets"][0]["dataset"] = "a<b>&c"
    page = to_html(report.markdown(data_report), "Data report: test")
    assert page.startswith("<!doctype html>") and "<title>Data report: test</title>" in page
    assert page.count("<table>") == 1 and page.count("<tr>") == 1 + 2 + 1  # header, datasets, total
    assert "<th>supervised</th>" in page and "<td>2,100</td>" in page
    assert "a&lt;b&gt;&amp;c" in page and "<b>" not in page  # cells are escaped
    assert "<code>fedcba9876543210</code>" in page
    summary = to_html(summary_text(fixture_benchmark()), "Benchmark")
    # Data, estimate, training (2), per prompt set the chain, tree and by-length table, the sets.
    assert "<strong>Lossless: yes.</strong>" in summary and summary.count("<table>") == 11
    assert "<h2>Prompt set <code>chat</code> (3 prompts)</h2>" in summary
    assert "<th>tree (num_steps/topk/num_draft_tokens)</th>" in summary
    assert "<h2>Recommended SGLang settings</h2>" in summary
    assert "--speculative-eagle-topk 2 --speculative-num-draft-tokens 6</code>" in summary


def test_build_report_writes_every_output(tmp_path):
    inputs = write_inputs(tmp_path / "in", fixture_benchmark(), fixture_data_report())
    outputs = rule_outputs(tmp_path / "results")
    result = build_report(ReportSettings(experiment="test"), inputs, outputs)
    assert result["lossless"] is True
    for path in outputs.values():
        assert Path(path).stat().st_size > 0, path
    assert "# Benchmark report: test" in Path(outputs["summary"]).read_text()
    assert "<td>2,048</td>" in Path(outputs["estimate_html"]).read_text()  # estimated tokens
    assert "<td>601</td>" in Path(outputs["data_report_html"]).read_text()  # supervised total
    assert "<h2>Recommended SGLang settings</h2>" in Path(outputs["summary_html"]).read_text()


def test_report_without_built_in_evaluation_shows_the_serving_benchmark(tmp_path):
    """evaluate.enabled: false (a target the HF evaluator cannot hold): every output is
    still written, the figures say why they are empty, and the serving tables appear."""
    inputs = write_inputs(tmp_path / "in", fixture_benchmark(), fixture_data_report())
    inputs["benchmark"] = []
    serving = tmp_path / "in" / "serve_benchmark.md"
    serving.write_text("# Serving benchmark\n\n| k | acceptance length |\n|---|---|\n| 3 | 2.87 |\n")
    inputs["serve_benchmark"] = [str(serving)]
    outputs = rule_outputs(tmp_path / "results")
    result = build_report(ReportSettings(experiment="test"), inputs, outputs)
    assert result["lossless"] is None
    for path in outputs.values():
        assert Path(path).stat().st_size > 0, path
    summary = Path(outputs["summary"]).read_text()
    assert "`evaluate.enabled: false`" in summary and "Lossless" not in summary
    assert "## Serving benchmark (SGLang)" in summary and "### Serving benchmark" in summary
    assert "| 3 | 2.87 |" in summary
    assert Path(outputs["acceptance_length"]).read_bytes() != Path(outputs["throughput"]).read_bytes()


# --- the workflow --------------------------------------------------------------------
def test_report_command_repeats_the_cli_run(tmp_path):
    path = tmp_path / "report.html"
    for program in ("/venv/bin/snakemake", "/venv/lib/site-packages/snakemake/__main__.py"):
        args = ["-d", "work", "report", "--cores", "2"]
        command = report_command([program, *args], path)
        assert command == [sys.executable, "-m", "snakemake", *args, "--report", str(path)]
    assert report_command(["/usr/bin/pytest", "-q"], path) is None  # not the CLI: nothing to repeat
    assert report_command(["snakemake", "--report", "x.html", "--report-after-run"], path) is None
    assert report_command(["snakemake", "--report=x.html"], path) is None


def workdir_config(work: Path) -> dict:
    """A test config; the model is absent, which is fine: only rule `report` runs."""
    facts = {"facts": write_rows(work / "facts.jsonl", ["Hi."])}
    held_out = {"held_out": {"path": str(write_rows(work / "held_out.jsonl", ["Bye."])), "format": "prompt"}}
    evaluate = {"enabled": True, "prompt_sets": held_out}
    return workflow_config(work, work / "no-model", facts, extract={"num_shards": 1}, evaluate=evaluate)


# Parses the workflow with Snakemake's API (in a subprocess: the API changes directory and
# logging) and prints how each output of rule `report` is flagged.
MARKERS = """
import json, sys
from pathlib import Path
from snakemake.api import SnakemakeApi
from snakemake.settings.types import ConfigSettings, OutputSettings, ResourceSettings
from snakemake.io import get_flag_value, is_flagged

snakefile, configfile, workdir = map(Path, sys.argv[1:])
with SnakemakeApi(OutputSettings(quiet={"all"})) as api:
    config = ConfigSettings(configfiles=[configfile])
    workflow = api.workflow(ResourceSettings(), config, snakefile=snakefile, workdir=workdir)
    rule = workflow._workflow.get_rule("report")  # the parsed rule: no public accessor
    marks = {}
    for name, path in rule.output._allitems():
        if not is_flagged(path, "report"):
            marks[name] = None
            continue
        flag = get_flag_value(path, "report")
        caption = str(flag.caption.get_path_or_uri(secret_free=True))
        marks[name] = {"caption": caption, "category": flag.category, "labels": flag.labels}
    print(json.dumps(marks))
"""


def test_rule_outputs_are_all_marked_for_the_report(tmp_path):
    config_path = tmp_path / "config.yaml"
    config_path.write_text(yaml.safe_dump(workdir_config(tmp_path)))
    result = subprocess.run(
        [sys.executable, "-c", MARKERS, str(REPO / "Snakefile"), str(config_path), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    marks = json.loads(result.stdout.strip().splitlines()[-1])
    assert set(marks) == set(rule_outputs(tmp_path))
    # benchmark.md is the Markdown of benchmark.html, which is the one shown.
    assert marks.pop("summary") is None
    for name, mark in marks.items():
        assert mark is not None, f"{name} is not marked for the report"
        caption = Path(mark["caption"]).resolve()
        assert caption.is_file() and caption.parent == REPO / "report", name
        assert mark["category"] in {"Benchmark", "Data", "Hidden-state estimate", "Training"}
        assert mark["labels"]["experiment"] == "test"


def report_results(html: str) -> dict:
    """The results table embedded in a Snakemake HTML report."""
    return json.loads(re.search(r"var results = (\{.*?\});\n", html, re.S).group(1))


@pytest.mark.slow
def test_snakemake_report_shows_every_result(tmp_path):
    """Rule `report` on upstream outputs placed at their planned paths, then the HTML report.

    Upstream rules are not allowed to run (`--allowed-rules report report_html`): their
    outputs are the test inputs above, so this exercises the rule, rule `report_html` and
    `--report`.
    """
    config = workdir_config(tmp_path)
    plan = plan_for(cfg.validate(copy.deepcopy(config)))
    inputs = write_inputs(tmp_path / "inputs", fixture_benchmark(), fixture_data_report(), plan.num_segments)
    results = tmp_path / plan.results_dir
    planned = {
        "data_report": plan.merged.path("report"),
        "data_report_md": plan.merged.path("report_md"),
        "estimate": tmp_path / plan.result("estimate"),
        "estimate_md": tmp_path / plan.result("estimate_md"),
        "train_summary": plan.train.path("summary"),
        "benchmark": plan.evaluate.path("json"),
    } | {f"metrics-{i}": plan.metrics(i) for i in range(plan.num_segments)}
    sources = inputs | {f"metrics-{i}": path for i, path in enumerate(inputs["metrics"])}
    for name, path in planned.items():
        atomic.write_text(path, Path(sources[name]).read_text())
    atomic.write_text(plan.search.path("json"), json.dumps(fixture_search()))  # the search is on by default

    run = snakemake(tmp_path, config, "report_html", "--allowed-rules", "report", "report_html")
    assert "draftsmith: writing the HTML report" in run.stderr
    outputs = rule_outputs(results)
    for path in outputs.values():
        assert Path(path).stat().st_size > 0, path
    assert (tmp_path / "logs" / "report" / "test.log").exists()
    assert (tmp_path / "benchmarks" / "report" / "test.tsv").exists()

    # The rule's report and one written by hand show the same results.
    by_hook = report_results((results / "report.html").read_text())
    explicit = subprocess.run(
        snakemake_cmd(tmp_path, tmp_path / "config.yaml", "report", "--allowed-rules", "report")
        + ["--report", str(tmp_path / "report.html")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert explicit.returncode == 0, explicit.stderr[-3000:]
    html = (tmp_path / "report.html").read_text()
    shown = report_results(html)
    assert set(shown) == set(by_hook)
    expected = {str(Path(p).relative_to(tmp_path)) for n, p in outputs.items() if n != "summary"}
    assert set(shown) == expected
    for path, entry in shown.items():
        assert entry["caption"].strip(), f"{path}: no caption"
        assert entry["mime_type"] == ("image/png" if path.endswith(".png") else "text/html")
    assert "speed-up" in Path(outputs["summary_html"]).read_text()
    assert "Settings search" in Path(outputs["summary_html"]).read_text()
    assert "draftsmith run <strong>test</strong>" in html  # report/workflow.rst, rendered


def test_summary_compares_the_prompt_sets_and_warns_when_they_disagree():
    benchmark = fixture_benchmark()
    text = summary_text(benchmark)
    part = section(text, "Acceptance by prompt set")
    chat, code = benchmark["prompt_sets"]["chat"], benchmark["prompt_sets"]["code"]
    assert table_row(part, "`chat`")[1:4] == [f"{chat['by_k'][k]['acceptance_length']:.2f}" for k in "123"]
    assert table_row(part, "`code`")[-1] == "100%"  # both sets' recommended tree accepts alike
    assert "Prompt-set warning" not in text
    code["by_tree"]["3-2-6"]["acceptance_length"] = 1.5
    benchmark["by_set"] = by_set(benchmark["prompt_sets"], "tree 3/2/6", 0.85)
    text = summary_text(benchmark)
    assert table_row(section(text, "Acceptance by prompt set"), "`code`")[-1] == "51%"
    warning = text.split("**Prompt-set warning:** ", 1)[1].split("\n", 1)[0]
    assert warning.startswith("at tree 3/2/6, acceptance length falls below 85% of the best set's (`chat`")
    assert "on `code` 1.50 (51%)" in warning
    assert text.index("Prompt-set warning") < text.index("## Data")
