"""A long-context prompt set from installed Python source, spread over the length buckets.

Acceptance by prompt length (`length`) needs prompts that fill every bucket, and short
chat questions fill only the first. The text is source code present on any machine with
Python, the standard library and named installed packages (files are read, nothing is
imported): each prompt is a slice of whole lines of one file that the target is asked to
continue or explain. Its length is counted in the target's tokens of the rendered prompt
(chat template, no system prompt: a configured `generation.system_prompt` adds its own),
so the builder reads the target's tokenizer. Each bucket of `--buckets`, cut to
`--min-tokens`..`--max-tokens`, is split into `--per-bucket` equal slots of one prompt each.

Held out twice over: only modules `docstrings` holds out (the same split by module
hash at the same share, so a docstring training set never saw them), and no file sharing
a line of 40 or more characters (normalised) with any text of the `--exclude` files
(training prompt files, any format). The evaluator's overlap check applies as to any set.

Rows: id, prompt, task, package, version, module, path, lines [first, last] (1-based,
inclusive), prompt_tokens.

    draftsmith promptgen long-context --out resources/eval/long_context.jsonl \\
        --tokenizer artifacts/model/<key>/hf --buckets 512 2048 8192 --max-tokens 7000
"""

from __future__ import annotations

import argparse
import importlib.metadata
import platform
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

from draftsmith.formats.prompt_sets import buckets, render
from draftsmith.fsutil import atomic
from draftsmith.promptgen.docstrings import (
    HELDOUT_SHARE,
    PromptSourceError,
    held_out,
    module_files,
    module_hash,
    normalised,
    source_roots,
)

TASKS = {
    "continue": "Continue this Python code from `{module}` ({package} {version}) where it stops:",
    "explain": "Explain what this Python code from `{module}` ({package} {version}) does, part by part:",
}
# Generated codec tables: no code anyone writes or asks about.
SKIPPED_MODULES = ("encodings",)
MIN_SHARED_LINE = 40  # characters: shorter lines (`return self`) are common to any code


@dataclass
class Source:
    package: str
    version: str
    module: str
    path: str  # relative to the package (or standard library) directory
    lines: list[str]
    cursor: int = 0  # lines before it went into earlier prompts
    taken: int = 0  # prompts made from it


def _version(prefix: str) -> str:
    if not prefix:
        return platform.python_version()
    dists = importlib.metadata.packages_distributions().get(prefix, [])
    return importlib.metadata.version(dists[0]) if dists else "unknown"


def sources(roots: list[tuple[str, Path]], share: float, excluded: set[str]) -> Iterator[Source]:
    """Held-out source files sharing no line with `excluded`, spread over modules by hash."""
    for prefix, root in roots:
        version = _version(prefix)
        files = [(m, p) for m, p in module_files(prefix, root) if held_out(m, share)]
        for module, path in sorted(files, key=lambda item: module_hash(item[0])):
            lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
            if module.split(".")[0] in SKIPPED_MODULES or excluded & _long_lines(lines):
                continue
            relative = str(path.relative_to(root))
            yield Source(prefix or "stdlib", version, module, relative, lines)


def _long_lines(lines: list[str]) -> set[str]:
    return {n for n in map(normalised, lines) if len(n) >= MIN_SHARED_LINE}


def _texts(value) -> Iterator[str]:
    """Every string in a JSON value: a prompt row of any format."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict | list):
        for item in value.values() if isinstance(value, dict) else value:
            yield from _texts(item)


def excluded_lines(paths: list[Path]) -> set[str]:
    """The long normalised lines of every text in the JSONL files `paths`."""
    return {
        line
        for path in paths
        for row in atomic.read_jsonl(path)
        for text in _texts(row)
        for line in _long_lines(text.splitlines())
    }


def length_slots(
    bounds: list[int], per_bucket: int, min_tokens: int, max_tokens: int
) -> list[tuple[int, int]]:
    """(lowest, highest) prompt tokens: each bucket (cut to min..max_tokens) split into
    `per_bucket` equal slots, one prompt each, so the lengths spread over the bucket."""
    out = []
    for bucket in buckets(bounds):
        low = max(bucket.min_tokens, min_tokens)
        high = min(max_tokens if bucket.max_tokens is None else bucket.max_tokens, max_tokens)
        edges = [low + (high + 1 - low) * i // per_bucket for i in range(per_bucket + 1)]
        out += [(start, end - 1) for start, end in pairwise(edges) if start < end]
    return out


def _prompt(source: Source, task: str, count: int) -> str:
    code = "\n".join(source.lines[source.cursor : source.cursor + count])
    head = TASKS[task].format(module=source.module, package=source.package, version=source.version)
    return f"{head}\n\n```python\n{code}\n```"


def _fit(source: Source, task: str, highest: int, tokenizer) -> tuple[int, int]:
    """The most lines from the cursor whose prompt has at most `highest` tokens, and its tokens
    (0, 0 when not even one line fits)."""

    def tokens(count: int) -> int:
        return len(render(tokenizer, [{"role": "user", "content": _prompt(source, task, count)}]))

    low, high, best = 1, len(source.lines) - source.cursor, (0, 0)
    if high and (count := tokens(high)) <= highest:
        return high, count  # the rest of the file fits: no search
    while low <= high:  # tokens grow with lines
        middle = (low + high) // 2
        if (count := tokens(middle)) <= highest:
            best, low = (middle, count), middle + 1
        else:
            high = middle - 1
    return best


def _take(source: Source, lowest: int, highest: int, tokenizer) -> dict | None:
    """A prompt of lowest..highest tokens from the source's next lines, or None."""
    while source.cursor < len(source.lines) and not source.lines[source.cursor].strip():
        source.cursor += 1
    task = sorted(TASKS)[module_hash(f"{source.module}:{source.cursor}") % len(TASKS)]
    count, tokens = _fit(source, task, highest, tokenizer)
    if not count or tokens < lowest:
        return None
    first = source.cursor + 1
    row = {
        "id": f"{source.module}:{first}-{source.cursor + count}",
        "prompt": _prompt(source, task, count),
        "task": task,
        "package": source.package,
        "version": source.version,
        "module": source.module,
        "path": source.path,
        "lines": [first, source.cursor + count],
        "prompt_tokens": tokens,
    }
    source.cursor += count
    source.taken += 1
    return row


def _candidates(opened: list[Source], found: Iterator[Source]) -> Iterator[Source]:
    """Files no prompt came from yet (read ones, then new ones), then the others: one file
    gives several prompts only when the rest cannot."""
    yield from [s for s in opened if not s.taken]
    for source in found:
        opened.append(source)
        yield source
    yield from [s for s in opened if s.taken]


def build_rows(found: Iterator[Source], lengths: list[tuple[int, int]], tokenizer) -> list[dict]:
    """One prompt per (lowest, highest), the longest first so they get the long files; files
    are read on demand and a file's next slice continues where its previous one ended."""
    opened: list[Source] = []
    rows = []
    for lowest, highest in sorted(lengths, key=lambda pair: -pair[1]):
        candidates = _candidates(opened, found)
        row = next((r for s in candidates if (r := _take(s, lowest, highest, tokenizer))), None)
        if row is None:
            raise PromptSourceError(
                f"no held-out source file left for a prompt of {lowest}-{highest} tokens "
                "(name more packages with --package, or raise --heldout-share)"
            )
        rows.append(row)
    return sorted(rows, key=lambda r: r["prompt_tokens"])


def build(
    out: Path,
    tokenizer,
    bounds: list[int],
    *,
    per_bucket: int = 2,
    min_tokens: int = 128,
    max_tokens: int = 7000,
    packages: list[str] | None = None,
    stdlib: bool = True,
    exclude: list[Path] | None = None,
    heldout_share: float = HELDOUT_SHARE,
) -> dict:
    """Write the prompt set (format prompt) to `out`; returns what it holds and where from."""
    roots = source_roots(packages or [], stdlib)
    found = sources(roots, heldout_share, excluded_lines(exclude or []))
    rows = build_rows(found, length_slots(bounds, per_bucket, min_tokens, max_tokens), tokenizer)
    atomic.write_jsonl(out, rows)
    return {
        "prompts": len(rows),
        "tokens": [r["prompt_tokens"] for r in rows],
        "roots": [str(r) for _, r in roots],
    }


def main(argv: list[str] | None = None) -> int:
    from draftsmith.target.load import load_tokenizer

    parser = argparse.ArgumentParser(prog="draftsmith promptgen long-context", description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tokenizer", required=True, help="the target's HF directory (its tokenizer)")
    parser.add_argument("--buckets", type=int, nargs="+", default=[512, 2048, 8192])
    parser.add_argument("--per-bucket", type=int, default=2)
    parser.add_argument("--min-tokens", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=7000, help="below the target's context")
    parser.add_argument("--package", action="append", default=[], help="an installed package to read too")
    parser.add_argument("--no-stdlib", action="store_true")
    parser.add_argument("--exclude", type=Path, action="append", default=[], help="a training prompt file")
    parser.add_argument(
        "--heldout-share", type=float, default=HELDOUT_SHARE, help="docstrings' held-out share"
    )
    args = parser.parse_args(argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    try:
        info = build(
            args.out,
            load_tokenizer(args.tokenizer),
            args.buckets,
            per_bucket=args.per_bucket,
            min_tokens=args.min_tokens,
            max_tokens=args.max_tokens,
            packages=args.package,
            stdlib=not args.no_stdlib,
            exclude=args.exclude,
            heldout_share=args.heldout_share,
        )
    except PromptSourceError as exc:
        print(f"draftsmith: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {info['prompts']} prompts of {info['tokens']} tokens from {info['roots']} to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
