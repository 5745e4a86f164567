"""Markdown tables, and a stand-alone HTML page of the Markdown the reports write.

Snakemake's HTML report shows HTML results inline but offers Markdown only as a
download, so each report is also written as HTML. The converter covers exactly the
subset draftsmith writes (headings, pipe tables, bullet lists, paragraphs, `code`,
**bold**): one source of truth, the Markdown, and no extra dependency.
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence

STYLE = """
body { font-family: sans-serif; margin: 1.5em; color: #222; }
table { border-collapse: collapse; margin: 0.8em 0; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }
th:first-child, td:first-child { text-align: left; }
th { background: #f3f3f3; }
code { background: #f3f3f3; padding: 0 0.2em; }
"""


_UNITS = ("B", "kB", "MB", "GB", "TB", "PB")


def human_size(count: int) -> str:
    """Bytes in the largest decimal unit that keeps the value at or above 1 (12.3 MB)."""
    value, unit = float(count), 0
    while value >= 1000 and unit < len(_UNITS) - 1:
        value, unit = value / 1000, unit + 1
    return f"{count} B" if unit == 0 else f"{value:.1f} {_UNITS[unit]}"


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A pipe table; cells are already formatted (see `fmt`)."""
    lines = [_row(headers), "|" + "|".join("---" for _ in headers) + "|"]
    lines += [_row(row) for row in rows]
    return "\n".join(lines) + "\n"


def _row(cells: Sequence[object]) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def fmt(value: object, digits: int = 2) -> str:
    """Thousands separators for ints, `digits` decimals for floats, n/a for missing."""
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def coverage_sentence(coverage: float) -> str:
    """How much of the target's output the draft vocabulary holds (benchmark tables)."""
    return (
        f"Draft vocabulary coverage of the target's output: {100 * coverage:.1f}% (a ceiling on acceptance)."
    )


def to_html(markdown: str, title: str) -> str:
    """A complete HTML page of `markdown` (the subset described in the module docstring)."""
    body = "\n".join(_block_html(block) for block in _blocks(markdown))
    return (
        '<!doctype html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{html.escape(title)}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n"
        + body
        + "\n</body>\n</html>\n"
    )


def _blocks(markdown: str) -> list[list[str]]:
    """Lines grouped into blocks: a heading is a block of its own, blank lines separate."""
    blocks: list[list[str]] = []
    current: list[str] = []
    for line in markdown.splitlines():
        if not line.strip() or line.startswith("#"):
            if current:
                blocks.append(current)
            current = []
            if line.startswith("#"):
                blocks.append([line])
            continue
        current.append(line)
    if current:
        blocks.append(current)
    return blocks


def _block_html(lines: list[str]) -> str:
    first = lines[0]
    if first.startswith("#"):
        level = min(len(first) - len(first.lstrip("#")), 6)
        return f"<h{level}>{_inline(first.lstrip('#').strip())}</h{level}>"
    if first.startswith("|"):
        return _table_html(lines)
    if first.startswith("- "):
        items = "".join(f"<li>{_inline(line[2:])}</li>" for line in lines)
        return f"<ul>{items}</ul>"
    return f"<p>{_inline(' '.join(lines))}</p>"


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _table_html(lines: list[str]) -> str:
    head = "".join(f"<th>{_inline(c)}</th>" for c in _cells(lines[0]))
    rows = ["<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in _cells(line)) + "</tr>" for line in lines[2:]]
    return f"<table>\n<tr>{head}</tr>\n" + "\n".join(rows) + "\n</table>"


def _inline(text: str) -> str:
    escaped = html.escape(text, quote=False)
    escaped = re.sub(r"`([^`]+)`", r"<code>\1</code>", escaped)
    return re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", escaped)
