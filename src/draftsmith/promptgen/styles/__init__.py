"""Training and held-out prompt sets in four styles, every row with its provenance.

A draft trained on a mix of styles is measured per style, so each style gets its own
training and held-out files, built from text that ships with Python and its installed
packages or that this module writes itself:

- `code`: complete a function's body from its signature (rebuilt from the AST) and its
  docstring, for the public documented functions and methods of the standard library
  and named `--package`s. Held out by module, with `docstrings`' split (same hash,
  same share) and its first-seen rule for repeated docstrings, so a docstring training
  set built from the same sources never saw a held-out module either.
- `math`: step-by-step word problems from project-written families, numbers drawn from a
  seeded generator (`math_problem(family, seed)` rebuilds a row). Held out by a hash of
  the normalised text.
- `chat`: project-written requests, templates x everyday subjects x tone variants. Held
  out by subject, so a held-out subject never appears in training.
- `prose`: paragraphs of plain prose from installed distributions' descriptions (their
  METADATA), from the Python reference (`pydoc_data.topics`) and from the docstrings of
  the standard library and named `--package`s, each with a task. Held out by
  distribution, by topic, and for docstrings by module with `docstrings`' split.

Within a style a normalised text (NFKC, casefold, whitespace) is kept once, the first
time it comes, so no held-out text is a training text, nor repeated in either split.
Rows: `id`, `prompt` and provenance (`source` "package": `package`, `version`, and for
code `module`, `name`; `source` "generator": `generator`, then `family`, `seed` or
`template`, `variant`, `subject`). At most `--train-count` training rows and exactly
`--heldout-count` held-out rows are taken round-robin over modules, families, subjects or
distributions, in a hash order seeded by `--seed` (which also seeds the math numbers);
too few held-out rows is an error. `--max-prompt-chars` leaves longer prompts out.

    draftsmith promptgen styles --out-dir data/styles --train-count 8000 \\
        --heldout-count 32 --package numpy

writes `data/styles/{style}-train.jsonl` and `{style}-heldout.jsonl` for each style.
`resources/eval/{chat,code,math}.jsonl` were built with it (their README gives the command).
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from draftsmith.fsutil import atomic
from draftsmith.promptgen.docstrings import PromptSourceError, module_hash, normalised
from draftsmith.promptgen.styles.chat import chat_candidates
from draftsmith.promptgen.styles.code import code_candidates
from draftsmith.promptgen.styles.common import Candidate
from draftsmith.promptgen.styles.math import math_candidates
from draftsmith.promptgen.styles.prose import prose_candidates

STYLES = ("code", "math", "chat", "prose")

# The provenance field whose values a selection is spread over.
SPREAD_BY = {"code": "module", "math": "family", "chat": "subject", "prose": "package"}


def candidates(style: str, packages: list[str], seed: int) -> Iterator[Candidate]:
    if style == "code":
        return code_candidates(packages)
    if style == "math":
        return math_candidates(seed)
    if style == "chat":
        return chat_candidates()
    if style == "prose":
        return prose_candidates(packages)
    raise PromptSourceError(f"unknown style {style!r}: one of {', '.join(STYLES)}")


def split(rows: Iterable[Candidate], max_chars: int | None = None) -> tuple[list[dict], list[dict]]:
    """Training and held-out rows; a repeated id or normalised text is dropped, so no
    text is in both. Prompts longer than `max_chars` are left out."""
    seen: set[str] = set()
    train: list[dict] = []
    heldout: list[dict] = []
    for candidate in rows:
        row = candidate.row
        if max_chars is not None and len(row["prompt"]) > max_chars:
            continue
        keys = (f"id:{row['id']}", normalised(row["prompt"]))
        if any(key in seen for key in keys):
            continue
        seen.update(keys)
        (heldout if candidate.held else train).append(row)
    return train, heldout


def spread(rows: list[dict], count: int, seed: int, group: str) -> list[dict]:
    """`count` rows taken round-robin over the values of field `group`, each group's rows
    and the groups in each round in a seeded hash order of the ids: a small set spans as
    many groups as it has rows."""
    ranked = sorted(rows, key=lambda row: module_hash(f"{seed}:{row['id']}"))
    before: Counter = Counter()  # rows of each group ahead in the hash order
    rounds = []
    for row in ranked:
        rounds.append(before[row[group]])
        before[row[group]] += 1
    order = sorted(range(len(ranked)), key=rounds.__getitem__)  # stable: hash order within a round
    return [ranked[i] for i in order[:count]]


@dataclass(frozen=True)
class StyleSet:
    style: str
    train: list[dict]
    heldout: list[dict]
    available: tuple[int, int]  # training and held-out rows before the counts were applied


def style_set(
    style: str,
    *,
    packages: list[str],
    train_count: int,
    heldout_count: int,
    seed: int = 0,
    max_prompt_chars: int | None = None,
) -> StyleSet:
    """One style's rows; refuses fewer held-out rows than `heldout_count`."""
    train, heldout = split(candidates(style, packages, seed), max_prompt_chars)
    if len(heldout) < heldout_count:
        cap = f" of at most {max_prompt_chars} characters" if max_prompt_chars is not None else ""
        raise PromptSourceError(
            f"style {style}: only {len(heldout)} held-out prompts{cap} (and {len(train)} training); "
            f"asked for {heldout_count}"
        )
    group = SPREAD_BY[style]
    chosen = (spread(train, train_count, seed, group), spread(heldout, heldout_count, seed, group))
    return StyleSet(style, *chosen, available=(len(train), len(heldout)))


def build(out_dir: Path, styles: Iterable[str], **options) -> list[StyleSet]:
    """Write `{style}-train.jsonl` and `{style}-heldout.jsonl` for each style; every
    style is built before any file is written, so a refusal writes nothing."""
    sets: list[StyleSet] = []
    refusals: list[str] = []
    for style in dict.fromkeys(styles):
        try:
            sets.append(style_set(style, **options))
        except PromptSourceError as exc:
            refusals.append(str(exc))  # go on: one run names every style short of rows
    if refusals:
        raise PromptSourceError("\n".join(refusals))
    for built in sets:
        atomic.write_jsonl(out_dir / f"{built.style}-train.jsonl", built.train)
        atomic.write_jsonl(out_dir / f"{built.style}-heldout.jsonl", built.heldout)
    return sets


def _count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="draftsmith promptgen styles",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out-dir", type=Path, required=True)
    parser.add_argument("--style", action="append", choices=STYLES, help="default: every style")
    parser.add_argument("--package", action="append", default=[], help="an installed package for `code`")
    parser.add_argument("--train-count", type=_count, default=10_000, help="at most this many per style")
    parser.add_argument("--heldout-count", type=_count, default=32, help="exactly this many per style")
    parser.add_argument("--seed", type=int, default=0, help="math numbers and the order rows are taken in")
    parser.add_argument("--max-prompt-chars", type=_count, default=None, help="leave out longer prompts")
    args = parser.parse_args(argv)
    try:
        sets = build(
            args.out_dir,
            args.style or STYLES,
            packages=args.package,
            train_count=args.train_count,
            heldout_count=args.heldout_count,
            seed=args.seed,
            max_prompt_chars=args.max_prompt_chars,
        )
    except PromptSourceError as exc:
        print(f"draftsmith: {exc}", file=sys.stderr)
        return 1
    for built in sets:
        train, heldout = built.available
        print(
            f"{built.style}: {len(built.train)} training (of {train}) and {len(built.heldout)} "
            f"held-out (of {heldout}) prompts in {args.out_dir}"
        )
    return 0
