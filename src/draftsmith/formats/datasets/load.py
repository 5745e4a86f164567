"""`load_prompts`: a configured dataset read, every row validated, bad rows counted."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from draftsmith.errors import DatasetError, InputChangedError
from draftsmith.formats.datasets.conversations import LAYOUTS, extractor, tools_of, with_system
from draftsmith.formats.datasets.rows import Bad, BadRow, LoadedDataset, Prompt
from draftsmith.formats.datasets.sources import Source, as_object, open_source

log = logging.getLogger(__name__)

# Schema defaults (dataset_defaults), for entries that were not resolved by config.
DEFAULT_MAX_BAD_FRACTION = 0.05
DEFAULT_MAX_PROMPT_TOKENS = 4096
ERROR_EXAMPLES = 5
# Memory bounds for any input, checked before parsing or tokenizing (a 50 MB line took
# 6.4 GB to tokenize). A JSONL line is read no further than the larger of MIN_LINE_BYTES
# and the longest prompt allowed written as JSON (12 bytes: a character outside the BMP
# escaped as two \uXXXX); a prompt over max_prompt_tokens x the longest token's characters
# (x2: a normalizer may shrink text, e.g. compose accents) cannot fit and is not tokenized.
MIN_LINE_BYTES = 16 << 20
JSON_BYTES_PER_CHAR = 12
NORMALIZER_MARGIN = 2

CountTokens = Callable[[list[dict], list[dict] | None], int]  # (messages, tools) -> tokens


def _where(path: Path, bad: BadRow) -> str:
    return f"{path}:{bad.line}" if bad.line is not None else f"{path} row {bad.index}"


def _describe(path: Path, bad: BadRow) -> str:
    field = f" {bad.field}:" if bad.field else ""
    return f"{_where(path, bad)}:{field} {bad.detail} ({bad.reason})"


def _check_bad_share(name: str, path: Path, bad: list[BadRow], inspected: int, limit: float) -> None:
    if not inspected or len(bad) / inspected <= limit:
        return
    examples = "\n".join(f"  {_describe(path, b)}" for b in bad[:ERROR_EXAMPLES])
    more = f"\n  ... and {len(bad) - ERROR_EXAMPLES} more" if len(bad) > ERROR_EXAMPLES else ""
    raise DatasetError(
        f"dataset {name!r}: {len(bad)} of {inspected} rows in {path} are bad "
        f"({len(bad) / inspected:.1%}), over max_bad_fraction {limit:.1%}:\n{examples}{more}"
    )


@dataclass(frozen=True)
class _Length:
    """How a prompt's length is judged: tokens, and characters before any tokenizing."""

    count_tokens: CountTokens | None
    max_tokens: int
    max_chars: int | None
    field: str  # the row field that holds the prompt

    def check(self, messages: list[dict], tools: list[dict] | None) -> None:
        if self.count_tokens is None:
            return
        chars = sum(len(m["content"]) for m in messages)
        chars += len(json.dumps(tools, ensure_ascii=False)) if tools else 0
        if self.max_chars is not None and chars > self.max_chars:
            raise Bad(
                "over-long",
                self.field,
                f"prompt has {chars} characters, over the {self.max_chars} that max_prompt_tokens "
                f"{self.max_tokens} allows (not tokenized)",
            )
        count = self.count_tokens(messages, tools)
        if count > self.max_tokens:
            detail = f"prompt has {count} tokens, over max_prompt_tokens {self.max_tokens}"
            raise Bad("over-long", self.field, detail)


def _length(entry: dict, count_tokens: CountTokens | None, max_token_chars: int | None) -> _Length:
    limit = entry.get("max_prompt_tokens", DEFAULT_MAX_PROMPT_TOKENS)
    counted = count_tokens is not None and max_token_chars is not None
    max_chars = limit * max_token_chars * NORMALIZER_MARGIN if counted else None
    fmt = entry["format"]
    field = (entry.get("prompt_field") or "prompt") if fmt == "prompt" else LAYOUTS[fmt].turns
    return _Length(count_tokens, limit, max_chars, field)


def load_prompts(
    name: str,
    entry: dict,
    count_tokens: CountTokens | None = None,
    max_token_chars: int | None = None,
    planned_sha256: str | None = None,
) -> LoadedDataset:
    """Read and validate the dataset `name` described by the resolved config `entry`.

    Rows are validated in source order until `max_samples` valid prompts are
    collected; the rows after that are counted but not inspected at all, and
    `skipped_over_cap` is that count. `count_tokens`, when given, is called only
    on otherwise-valid rows before the cap; a prompt over `max_prompt_tokens`
    is a bad row ("over-long"). With `max_token_chars` (the tokenizer's longest
    token, `target.load.longest_token_chars`), a prompt too long in characters
    to fit is refused without tokenizing, and no JSONL line is read past what
    such a prompt could take. The bad-row share is taken over inspected rows.
    With `planned_sha256` (the source hash the job's output key was computed from), the
    content read must hash to it, else `InputChangedError`: a job never writes one
    content under another content's key.
    """
    path = Path(entry["path"])
    extract = extractor(name, entry)
    length = _length(entry, count_tokens, max_token_chars)
    max_line_bytes = max(MIN_LINE_BYTES, JSON_BYTES_PER_CHAR * (length.max_chars or 0))
    source = open_source(name, path, entry.get("split"), max_line_bytes)
    try:
        prompts, bad, inspected, skipped = _read_rows(name, path, source, extract, length, entry)
        if planned_sha256 is not None:
            _check_read(name, path, source.sha256(), planned_sha256)
    finally:
        source.close()
    return _finish(name, entry, path, prompts, bad, inspected, skipped)


def _check_read(name: str, path: Path, read: str, planned: str) -> None:
    if read != planned:
        raise InputChangedError(
            f"dataset {name!r}: {path} changed after this job was planned: its output key was "
            f"computed from content sha256 {planned}, the content read has sha256 {read}. "
            "Nothing was written; run snakemake again to plan it anew."
        )


def _read_rows(
    name: str, path: Path, source: Source, extract: Callable, length: _Length, entry: dict
) -> tuple[list[Prompt], list[BadRow], int, int]:
    system_prompt = (entry.get("generation") or {}).get("system_prompt")
    cap = entry.get("max_samples")
    prompts: list[Prompt] = []
    bad: list[BadRow] = []
    inspected = 0
    for line, raw in source.rows:
        index = inspected
        inspected += 1
        try:
            row = as_object(raw)
            messages = with_system(extract(row), system_prompt)
            tools = tools_of(row)
            length.check(messages, tools)
        except Bad as exc:
            bad.append(BadRow(index, line, exc.field, exc.reason, exc.detail))
            log.warning("%s: %s", name, _describe(path, bad[-1]))
            continue
        prompts.append(Prompt(f"{name}-{index:06d}", index, line, messages, tools))
        if cap is not None and len(prompts) >= cap:
            break
    return prompts, bad, inspected, _count_rest(source, inspected)


def _count_rest(source: Source, inspected: int) -> int:
    if source.total is not None:
        return source.total - inspected
    return sum(1 for _ in source.rows)  # JSONL: raw lines only, nothing parsed


def _finish(
    name: str,
    entry: dict,
    path: Path,
    prompts: list[Prompt],
    bad: list[BadRow],
    inspected: int,
    skipped: int,
) -> LoadedDataset:
    limit = entry.get("max_bad_fraction", DEFAULT_MAX_BAD_FRACTION)
    _check_bad_share(name, path, bad, inspected, limit)
    if not prompts:
        raise DatasetError(f"dataset {name!r}: {path} has no valid prompt ({inspected} rows read)")
    log.info(
        "%s: %d prompts from %s (%d rows: %d bad, %d skipped over max_samples)",
        name,
        len(prompts),
        path,
        inspected + skipped,
        len(bad),
        skipped,
    )
    return LoadedDataset(name, prompts, bad, inspected + skipped, skipped)
