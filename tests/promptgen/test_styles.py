"""Prompt sets in four styles: counts, provenance, determinism, splits that share nothing,
refusals, and the three shipped held-out sets."""

from __future__ import annotations

import ast
import json
import platform
import re
from pathlib import Path

import pytest

from draftsmith.formats.datasets.load import load_prompts
from draftsmith.formats.prompt_sets import prompt_hash
from draftsmith.promptgen import docstrings as dp
from draftsmith.promptgen import styles as sp
from draftsmith.promptgen.styles.chat import ACTIVITIES, CHAT_TEMPLATES, TOPICS
from draftsmith.promptgen.styles.common import GENERATOR
from draftsmith.promptgen.styles.math import MATH_FAMILIES, math_problem
from draftsmith.promptgen.styles.prose import MAX_PARAGRAPH, MIN_PARAGRAPH, distributions, prose_paragraphs

REPO = Path(__file__).resolve().parents[2]
PROVENANCE = {
    "code": {"source", "package", "version", "module", "name"},
    "math": {"source", "generator", "family", "seed"},
    "chat": {"source", "generator", "template", "variant", "subject"},
    "prose": {"source", "package", "version"},
}
# The field a style is held out by (math: the text itself).
SPLIT_BY = {"code": "module", "chat": "subject", "prose": "package", "math": "prompt"}


def split_key(style: str, row: dict) -> str:
    """What a row is held out by: its field of SPLIT_BY; for prose, a Python reference
    paragraph's topic or a docstring paragraph's module (each its own namespace: the
    reference's topic `types` is not the module `types`)."""
    if style == "prose":
        field = next(f for f in ("topic", "module", "package") if f in row)
        return f"{field}:{row[field]}"
    return row[SPLIT_BY[style]]


SMALL = {"packages": [], "train_count": 300, "heldout_count": 8, "seed": 0}
# The command resources/eval/README.md gives for the shipped sets.
SHIPPED = {"packages": [], "train_count": 0, "heldout_count": 12, "seed": 0, "max_prompt_chars": 700}
DEMO_FORMATS = {"chat": "messages", "code": "prompt", "math": "sharegpt"}


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def dataset_entry(path: Path, fmt: str = "prompt") -> dict:
    return {
        "path": str(path),
        "format": fmt,
        "prompt_field": "prompt",
        "split": None,
        "max_samples": None,
        "max_bad_fraction": 0.0,
        "max_prompt_tokens": 4096,
        "generation": {"system_prompt": None},
    }


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, list[sp.StyleSet]]:
    out = tmp_path_factory.mktemp("styles")
    return out, sp.build(out, sp.STYLES, **SMALL)


@pytest.fixture(scope="module")
def full() -> dict[str, tuple[list[dict], list[dict]]]:
    """Every training and held-out row each style has on this machine (stdlib for code)."""
    return {style: sp.split(sp.candidates(style, [], 0)) for style in sp.STYLES}


def test_counts_ids_and_provenance(built):
    out, sets = built
    assert [s.style for s in sets] == list(sp.STYLES)
    for built_set in sets:
        style = built_set.style
        train, heldout = read(out / f"{style}-train.jsonl"), read(out / f"{style}-heldout.jsonl")
        assert len(train) == min(300, built_set.available[0]) > 0 and len(heldout) == 8
        ids = [r["id"] for r in train + heldout]
        assert len(ids) == len(set(ids)), style
        texts = {dp.normalised(r["prompt"]) for r in train}
        assert not any(dp.normalised(r["prompt"]) in texts for r in heldout), style
        for row in train + heldout:
            assert {"id", "prompt"} | PROVENANCE[style] <= set(row), (style, row)
            assert row["prompt"].strip() and all(row[field] != "" for field in PROVENANCE[style])


def test_provenance_values(built):
    out, _ = built
    code = read(out / "code-train.jsonl")
    assert {(r["source"], r["package"], r["version"]) for r in code} == {
        ("package", "python-stdlib", platform.python_version())
    }
    for style in ("math", "chat"):
        rows = read(out / f"{style}-train.jsonl")
        assert {(r["source"], r["generator"]) for r in rows} == {("generator", f"{GENERATOR}.{style}")}
    # The name the rows record is the module's before it moved to promptgen: resources/eval/
    # ships rows that carry it, and the pipeline's keys hash those files' bytes.
    assert GENERATOR == "draftsmith.style_prompts"
    for row in read(out / "math-train.jsonl")[:50]:
        assert math_problem(row["family"], row["seed"]) == row["prompt"]
    for row in read(out / "chat-train.jsonl")[:50]:
        assert CHAT_TEMPLATES[row["template"]][0].format(s=row["subject"]) in row["prompt"]


def test_small_sets_are_spread_over_groups(built):
    out, _ = built
    for style, field in sp.SPREAD_BY.items():
        heldout = read(out / f"{style}-heldout.jsonl")
        groups = {row[field] for row in heldout}
        assert len(groups) >= min(4, len(heldout)), (style, groups)
    math = read(out / "math-train.jsonl")
    assert len({r["family"] for r in math}) == len(MATH_FAMILIES) >= 10


@pytest.mark.slow  # a second build over the standard library
def test_two_builds_are_byte_identical(built, tmp_path):
    out, _ = built
    sp.build(tmp_path, sp.STYLES, **SMALL)
    for path in sorted(out.glob("*.jsonl")):
        assert (tmp_path / path.name).read_bytes() == path.read_bytes(), path.name


@pytest.mark.parametrize("style", sp.STYLES)
def test_heldout_shares_no_split_key_or_text_with_training(full, style):
    train, heldout = full[style]
    assert heldout, style
    assert not {split_key(style, r) for r in heldout} & {split_key(style, r) for r in train}
    texts = [dp.normalised(r["prompt"]) for r in train + heldout]
    assert len(texts) == len(set(texts))  # no repeat within or across the splits


def test_generators_give_thousands_of_training_rows(full):
    assert len(full["math"][0]) >= 8000 and len(full["chat"][0]) >= 8000
    assert len(full["code"][0]) >= 1000  # the standard library alone
    assert len(ACTIVITIES + TOPICS) == len(set(ACTIVITIES + TOPICS)) >= 150
    assert len(CHAT_TEMPLATES) >= 25


@pytest.mark.slow  # collects the docstrings of the whole standard library
def test_code_holds_out_what_docstrings_holds_out(full):
    train, heldout = full["code"]
    assert all(dp.held_out(r["module"]) for r in heldout)
    assert not any(dp.held_out(r["module"]) for r in train)
    # A docstring training set from the same sources never quotes a held-out docstring.
    docs_train, _ = dp.collect(dp.source_roots([]), dp.HELDOUT_SHARE)
    doc_texts = "\n".join(dp.normalised(r["prompt"]) for r in docs_train)
    for row in heldout[:40]:
        doc = ast.get_docstring(_function(row))
        assert dp.normalised(dp.clean_doc(doc)) not in doc_texts, row["id"]


def _function(row: dict) -> ast.FunctionDef | ast.AsyncFunctionDef:
    """The fenced code of a code row, given a body, parsed; its function's node."""
    block = row["prompt"].split("```python\n", 1)[1].removesuffix("\n```")
    indent = "        " if "." in row["name"] else "    "
    tree = ast.parse(f"{block}\n{indent}...\n")
    node = tree.body[0]
    if "." in row["name"]:
        assert isinstance(node, ast.ClassDef) and node.name == row["name"].split(".")[0]
        node = node.body[0]
    assert isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    assert node.name == row["name"].rsplit(".", 1)[-1]
    return node


def test_code_prompts_are_signatures_with_docstrings(full):
    rows = full["code"][0] + full["code"][1]
    for row in rows:
        node = _function(row)
        assert ast.get_docstring(node), row["id"]
        assert len(node.body) == 2  # the docstring and the body still to write
    blocks = {r["id"]: r["prompt"].split("```python\n", 1)[1] for r in rows}
    assert blocks["asyncio.tasks.wait_for"].startswith("async def wait_for(fut, timeout):\n")
    assert blocks["functools.cache"].startswith("def cache(user_function, /):\n")
    assert blocks["asyncio.timeouts.timeout"].startswith("def timeout(delay: Optional[float]) -> Timeout:\n")
    assert blocks["json.dumps"].startswith("def dumps(obj, *, skipkeys=False, ensure_ascii=True,")
    assert blocks["datetime.date.fromordinal"].startswith(
        "class date:\n    @classmethod\n    def fromordinal(cls, n):\n"
    )
    # Its docstring quotes b'\\n': cleaned and re-indented it would be garbled, so it is left out.
    assert "asyncio.streams.StreamReader.readline" not in blocks


def test_prose_paragraphs_keep_only_plain_prose():
    sentence = "This library reads calendars and turns every event into a plain record. "
    prose = sentence * 4
    text = "\n\n".join(
        [
            "# A heading",
            "[![badge](https://example.org/b.svg)](https://example.org)",
            "Title\n=====",
            prose.strip(),
            f"Wrapped **lines** of\n{sentence * 3}with a [link](https://example.org) in them.",
            "```python\n" + prose + "\n\n" + prose + "\n```",
            "    indented code " + prose,
            "| a | b |\n|---|---|",
            "* " + prose,
            "1. " + prose,
            "Too short.",
            "Install it like this, " + prose + "then run:",
        ]
    )
    kept = list(prose_paragraphs(text))
    assert kept == [prose.strip(), f"Wrapped lines of {sentence * 3}with a link in them."]


def test_prose_rows_come_from_distributions_the_python_reference_and_docstrings(full):
    from pydoc_data.topics import topics

    train, heldout = full["prose"]
    names = {name for name, _, _ in distributions()}
    files = dict(dp.module_files(*dp.source_roots([])[0]))
    for row in train + heldout:
        paragraph = row["prompt"].split("\n\n", 1)[1]
        assert MIN_PARAGRAPH <= len(paragraph) <= MAX_PARAGRAPH
        if "topic" in row:
            assert row["package"] == "python" and " ".join(paragraph.split()) in " ".join(
                topics[row["topic"]].split()
            )
        elif "module" in row:
            # The paragraph is in that module's source, and the module obeys docstrings' split.
            assert row["package"] == "python-stdlib" and row["module"] in row["prompt"].split("\n", 1)[0]
            assert dp.held_out(row["module"]) == (row in heldout)
            source = set(re.findall(r"[A-Za-z]+", files[row["module"]].read_text(errors="replace")))
            assert set(re.findall(r"[A-Za-z]+", paragraph)) <= source, row["id"]
        else:
            assert row["package"] in names
    assert sum("topic" in row for row in train) > 100
    assert sum("module" in row for row in train) > 500  # the stdlib alone: thousands with packages


def test_spread_takes_one_row_per_group_first():
    rows = [{"id": f"a{i}", "g": "a"} for i in range(5)] + [{"id": "b", "g": "b"}, {"id": "c", "g": "c"}]
    assert sorted(r["g"] for r in sp.spread(rows, 3, 0, "g")) == ["a", "b", "c"]
    assert len(sp.spread(rows, 100, 0, "g")) == 7


def test_too_few_heldout_rows_is_refused_and_nothing_is_written(tmp_path):
    with pytest.raises(dp.PromptSourceError) as refused:
        sp.build(tmp_path, ["math", "chat"], packages=[], train_count=10, heldout_count=100_000)
    for style in ("math", "chat"):
        assert re.search(rf"style {style}: only \d+ held-out prompts .*asked for 100000", str(refused.value))
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(dp.PromptSourceError, match=r"of at most 40 characters"):
        sp.style_set("math", packages=[], train_count=10, heldout_count=5, max_prompt_chars=40)


# --- the shipped held-out sets ----------------------------------------------------------


@pytest.mark.parametrize("style", ["chat", "code", "math"])
def test_shipped_heldout_sets(style, tmp_path):
    """resources/eval/{style}.jsonl: read with no bad row, short, no demo training prompt,
    and what the README's command builds (code only on the Python it was built with)."""
    path = REPO / "resources" / "eval" / f"{style}.jsonl"
    loaded = load_prompts(style, dataset_entry(path))
    assert loaded.bad_rows == [] and len(loaded.prompts) == loaded.total_rows == 12
    rows = read(path)
    assert all(len(r["prompt"]) <= 700 and PROVENANCE[style] <= set(r) for r in rows)
    training = {
        prompt_hash(p.messages)
        for name, fmt in DEMO_FORMATS.items()
        for p in load_prompts(
            name, dataset_entry(REPO / "resources" / "datasets" / f"{name}.jsonl", fmt)
        ).prompts
    }
    assert not {prompt_hash(p.messages) for p in loaded.prompts} & training
    if style == "code" and platform.python_version() != rows[0]["version"]:
        pytest.skip(f"built with Python {rows[0]['version']}, this is {platform.python_version()}")
    sp.build(tmp_path, [style], **SHIPPED)
    assert (tmp_path / f"{style}-heldout.jsonl").read_bytes() == path.read_bytes()
