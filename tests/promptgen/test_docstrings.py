"""Prompt datasets from installed code's docstrings: deterministic, split by module, no repeats."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from draftsmith.promptgen import docstrings as dp

PACKAGE = '''
"""Module docstring."""


def {name}(x):
    """{doc}

    Parameters
    ----------
    x : int

    >>> {name}(1)
    """


def _private():
    """A private helper that has a long enough docstring to be kept otherwise, surely."""


class Widget:
    """A widget that holds a value and can show it to the user in a friendly way."""

    def show(self):
        """Print the widget's value to standard output, followed by a newline."""
'''


def make_package(root, modules: int):
    pkg = root / "demo_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for i in range(modules):
        doc = f"Compute the value number {i} of the series, rounding half to even, in module {i}."
        (pkg / f"mod{i:02d}.py").write_text(PACKAGE.format(name=f"compute_{i}", doc=doc))
    (pkg / "tests").mkdir()
    (pkg / "tests" / "test_x.py").write_text(
        'def test_x():\n    """A test docstring long enough to count otherwise."""\n'
    )
    return pkg


@pytest.fixture
def package(tmp_path, monkeypatch):
    make_package(tmp_path, 30)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_rows_are_prose_public_and_split_by_module(package, tmp_path):
    train, heldout = tmp_path / "train.jsonl", tmp_path / "heldout.jsonl"
    info = dp.build(
        train, heldout, packages=["demo_pkg"], min_train=10, heldout_count=1, heldout_share=0.2, stdlib=False
    )
    rows = [json.loads(line) for line in train.read_text().splitlines()]
    held = [json.loads(line) for line in heldout.read_text().splitlines()]
    assert info["train"] == len(rows) and info["heldout"] == len(held) == 1
    ids = [r["id"] for r in rows]
    assert "demo_pkg.mod00.compute_0" in ids or "demo_pkg.mod00.compute_0" in [r["id"] for r in held]
    assert not any("_private" in i or "test_x" in i for i in ids)
    prompt = next(r["prompt"] for r in rows if ".compute_" in r["id"])
    assert "Parameters" not in prompt and ">>>" not in prompt and "rounding half to even" in prompt
    # The Widget docstrings repeat in every module: kept once.
    assert sum(r["id"].endswith(".Widget") for r in rows + held) == 1
    held_modules = {r["id"].rsplit(".", 1)[0] for r in held}
    assert not held_modules & {r["id"].rsplit(".", 1)[0] for r in rows}


def build_demo(tmp_path, name: str, templates: int = 1) -> tuple[Path, Path]:
    """The demo package's prompt files (a fifth of its modules held out)."""
    train, heldout = tmp_path / f"t{name}.jsonl", tmp_path / f"h{name}.jsonl"
    dp.build(
        train,
        heldout,
        packages=["demo_pkg"],
        min_train=5,
        heldout_count=1,
        heldout_share=0.2,
        stdlib=False,
        templates=templates,
    )
    return train, heldout


def test_build_is_deterministic(package, tmp_path):
    outputs = []
    for run in range(2):
        train, heldout = build_demo(tmp_path, str(run))
        outputs.append((train.read_bytes(), heldout.read_bytes()))
    assert outputs[0] == outputs[1]


def test_templates_multiply_training_prompts_only(package, tmp_path):
    def build(templates: int) -> tuple[list[dict], list[dict]]:
        files = build_demo(tmp_path, f"x{templates}", templates)
        return [[json.loads(line) for line in f.read_text().splitlines()] for f in files]

    one, held_one = build(1)
    two, held_two = build(2)
    assert held_two == held_one  # the evaluation set does not move
    assert len(two) == 2 * len(one)
    # Each object's first prompt is the one-template prompt; the second has another template.
    by_id = {r["id"]: r["prompt"] for r in two}
    for row in one:
        assert by_id[row["id"]] == row["prompt"]
        other = by_id[f"{row['id']}~2"]
        assert other != row["prompt"] and other.split("\n\n", 1)[1] == row["prompt"].split("\n\n", 1)[1]
    with pytest.raises(dp.PromptSourceError, match="--templates 5"):
        build(5)


def test_too_few_prompts_is_an_error_naming_the_sources(package, tmp_path):
    with pytest.raises(dp.PromptSourceError, match=r"only \d+ training .*demo_pkg.*--package"):
        dp.build(
            tmp_path / "t.jsonl",
            tmp_path / "h.jsonl",
            packages=["demo_pkg"],
            min_train=10_000,
            heldout_count=1,
            stdlib=False,
        )
    assert not (tmp_path / "t.jsonl").exists()


def test_unknown_package_is_named(tmp_path):
    with pytest.raises(dp.PromptSourceError, match="--package no_such_pkg_xyz"):
        dp.source_roots(["no_such_pkg_xyz"], stdlib=False)


@pytest.mark.slow  # reads every docstring of the standard library
def test_stdlib_alone_gives_thousands_of_prompts(tmp_path):
    code = dp.main(
        [
            "--train",
            str(tmp_path / "t.jsonl"),
            "--heldout",
            str(tmp_path / "h.jsonl"),
            "--min-train",
            "1000",
            "--heldout-count",
            "16",
        ]
    )
    assert code == 0, sys.version
    assert sum(1 for _ in (tmp_path / "t.jsonl").open()) >= 1000
