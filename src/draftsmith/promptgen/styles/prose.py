"""The `prose` style: plain-prose paragraphs of installed distributions' descriptions, of
the Python reference and of the docstrings of the standard library and named packages,
each with a task; held out by distribution, topic or module (docstrings' split)."""

from __future__ import annotations

import ast
import importlib.metadata
import platform
import re
from collections.abc import Iterator
from pathlib import Path

from draftsmith.promptgen.docstrings import (
    held_out,
    module_files,
    module_hash,
    public_definitions,
    source_roots,
)
from draftsmith.promptgen.styles.code import package_version
from draftsmith.promptgen.styles.common import PROSE_HELDOUT_SHARE, Candidate

PROSE_TASKS = (
    "Summarise this paragraph from the description of the Python package `{package}` in two sentences:",
    "Rewrite this paragraph from the `{package}` package's description so that a newcomer to "
    "programming can follow it:",
    "Give the three key points of this paragraph from the description of `{package}`:",
    "Suggest a short, descriptive title for this paragraph from the description of `{package}`:",
)
# The same tasks for a paragraph of the Python language reference (`pydoc_data.topics`).
REFERENCE_TASKS = (
    "Summarise this paragraph of the Python reference on `{topic}` in two sentences:",
    "Rewrite this paragraph of the Python reference on `{topic}` so that a newcomer to "
    "programming can follow it:",
    "Give the three key points of this paragraph of the Python reference on `{topic}`:",
    "Suggest a short, descriptive title for this paragraph of the Python reference on `{topic}`:",
)
# The same tasks for a paragraph of a module's, class's or function's docstring.
DOCSTRING_TASKS = (
    "Summarise this paragraph from the documentation of the Python module `{module}` in two sentences:",
    "Rewrite this paragraph from the documentation of `{module}` so that a newcomer to "
    "programming can follow it:",
    "Give the three key points of this paragraph from the documentation of `{module}`:",
    "Suggest a short, descriptive title for this paragraph from the documentation of `{module}`:",
)
MIN_PARAGRAPH, MAX_PARAGRAPH = 200, 1200
# Paragraph starts that are markup, not prose: headings, lists, tables, quotes, HTML,
# badges, reStructuredText directives and field lists.
MARKUP_STARTS = ("#", "|", "+-", "+=", ">", "<", "![", "[!", "..", "* ", "- ", "+ ", ":", "=", "{")
_LIST_ITEM = re.compile(r"\d+[.)]\s")
_UNDERLINE = re.compile(r"([=\-~^*#+`'\".:_])\1{2,}")
_INLINE = (
    (re.compile(r"!?\[([^\]]*)\]\([^)]*\)"), r"\1"),  # Markdown link or image: its text
    (re.compile(r"`([^`<]*?)\s*<[^>]*>`__?"), r"\1"),  # reStructuredText link: its text
    (re.compile(r":[a-z:]+:`([^`]*)`"), r"\1"),  # reStructuredText role
    (re.compile(r"(\*\*|__|``|\*|`)(\S(?:.*?\S)?)\1"), r"\2"),  # emphasis and code spans
)


def prose_candidates(packages: list[str], stdlib: bool = True) -> Iterator[Candidate]:
    """One prompt per prose paragraph of each installed distribution's description, then
    of each topic of the Python reference that the standard library ships for `help()`,
    then of the docstrings of the standard library and `packages`."""
    for name, version, text in distributions():
        held = held_out(_canonical(name), PROSE_HELDOUT_SHARE)
        for i, paragraph in enumerate(prose_paragraphs(text)):
            row_id = f"{_canonical(name)}#{i}"
            task = PROSE_TASKS[module_hash(row_id) % len(PROSE_TASKS)].format(package=name)
            row = {"id": row_id, "prompt": f"{task}\n\n{paragraph}", "source": "package"}
            yield Candidate(held, row | {"package": name, "version": version})
    yield from _reference_candidates()
    yield from _docstring_candidates(packages, stdlib)


def _reference_candidates() -> Iterator[Candidate]:
    """Held out by topic; rows name the package `python` and the topic."""
    from pydoc_data.topics import topics

    for topic in sorted(topics):
        held = held_out(f"pydoc_data.topics:{topic}", PROSE_HELDOUT_SHARE)
        for i, paragraph in enumerate(prose_paragraphs(topics[topic], markup=False)):
            row_id = f"python-reference:{topic}#{i}"
            task = REFERENCE_TASKS[module_hash(row_id) % len(REFERENCE_TASKS)].format(topic=topic)
            row = {"id": row_id, "prompt": f"{task}\n\n{paragraph}", "source": "package"}
            provenance = {"package": "python", "version": platform.python_version(), "topic": topic}
            yield Candidate(held, row | provenance)


def _docstring_candidates(packages: list[str], stdlib: bool) -> Iterator[Candidate]:
    """Held out by module with `docstrings`' split, so a module whose docstrings are held out
    there gives no training paragraph here; rows name the package, version and module."""
    for prefix, root in source_roots(packages, stdlib):
        package, version = package_version(prefix)
        for module, path in module_files(prefix, root):
            held = held_out(module)
            for name, doc in _docstrings(path):
                for i, paragraph in enumerate(prose_paragraphs(doc)):
                    row_id = f"{module}:{name}#{i}"
                    task = DOCSTRING_TASKS[module_hash(row_id) % len(DOCSTRING_TASKS)].format(module=module)
                    row = {"id": row_id, "prompt": f"{task}\n\n{paragraph}", "source": "package"}
                    yield Candidate(held, row | {"package": package, "version": version, "module": module})


def _docstrings(path: Path) -> Iterator[tuple[str, str]]:
    """(name, docstring) of a file's module (name "") and its public definitions."""
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except (SyntaxError, ValueError):
        return  # a file for another Python version
    yield "", ast.get_docstring(tree) or ""
    for node in tree.body:
        for obj, name in public_definitions(node, ""):
            yield name, ast.get_docstring(obj) or ""


def distributions() -> list[tuple[str, str, str]]:
    """(name, version, description) of each installed distribution, sorted by name; the
    first of several copies on the path is the one Python imports."""
    found: dict[str, tuple[str, str, str]] = {}
    for dist in importlib.metadata.distributions():
        meta = dist.metadata
        name = meta["Name"]
        if name and _canonical(name) not in found:
            # The body of newer metadata, or the older header (importlib dedents it).
            text = meta["Description"] or ""
            found[_canonical(name)] = (name, meta["Version"] or "unknown", text)
    return [found[key] for key in sorted(found)]


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).casefold()


def prose_paragraphs(text: str, markup: bool = True) -> Iterator[str]:
    """Plain-prose paragraphs of a Markdown or reStructuredText description, unwrapped,
    inline markup reduced to its text (with `markup`; plain text keeps `__debug__` whole);
    code, tables, lists and headings are skipped."""
    for block in _blocks(text):
        paragraph = _as_prose(block, markup)
        if paragraph is not None:
            yield paragraph


def _blocks(text: str) -> Iterator[list[str]]:
    """Blank-line separated blocks outside fenced code."""
    block: list[str] = []
    fenced = False
    for line in [*text.splitlines(), ""]:
        if line.lstrip().startswith(("```", "~~~")):
            fenced, block = not fenced, []
        elif not fenced and line.strip():
            block.append(line)
        elif block:
            yield block
            block = []


def _as_prose(block: list[str], markup: bool) -> str | None:
    if any(line[:1].isspace() or _UNDERLINE.fullmatch(line.strip()) for line in block):
        return None  # indented code or quotes, or a heading with its underline
    first = block[0].lstrip()
    if first.startswith(MARKUP_STARTS) or _LIST_ITEM.match(first):
        return None
    text = " ".join(line.strip() for line in block)
    for pattern, replacement in _INLINE if markup else ():
        text = pattern.sub(replacement, text)
    return text if _plain(text) else None


def _plain(text: str) -> bool:
    if not MIN_PARAGRAPH <= len(text) <= MAX_PARAGRAPH or not text.endswith((".", "!", "?", '."', ".)")):
        return False
    if "://" in text or "::" in text or any(mark in text for mark in "|<>{}[]`*\\"):
        return False  # leftover markup or links: not the plain prose this style is for
    letters = [c for c in text if c.isalpha()]
    if len(letters) < 0.75 * len(text.replace(" ", "")):
        return False
    return sum(c.isupper() for c in letters) < 0.3 * len(letters)  # licence shouting
