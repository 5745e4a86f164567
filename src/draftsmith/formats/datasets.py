"""Load prompt datasets declared in config, validating every row.

Sources are a JSONL file (`.jsonl`/`.json`, one object per line), a Parquet
file, or a directory written by `datasets`' `save_to_disk`. Rows become chat
prompts (a message list ending with a user turn); every row that cannot become
one is reported as a `BadRow`, never dropped silently. A dataset whose share of
bad rows exceeds `max_bad_fraction` is a `DatasetError`.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, BinaryIO

from draftsmith.errors import DatasetError, InputChangedError
from draftsmith.fsutil.digests import HashingReader, source_sha256

log = logging.getLogger(__name__)

# Schema defaults (dataset_defaults), for entries that were not resolved by config.
DEFAULT_MAX_BAD_FRACTION = 0.05
DEFAULT_MAX_PROMPT_TOKENS = 4096
ERROR_EXAMPLES = 5
JSONL_SUFFIXES = (".jsonl", ".json")
PARQUET_BATCH_ROWS = 1024
UTF8_BOM = b"\xef\xbb\xbf"
# Memory bounds for any input, checked before parsing or tokenizing (a 50 MB line took
# 6.4 GB to tokenize). A JSONL line is read no further than the larger of MIN_LINE_BYTES
# and the longest prompt allowed written as JSON (12 bytes: a character outside the BMP
# escaped as two \uXXXX); a prompt over max_prompt_tokens x the longest token's characters
# (x2: a normalizer may shrink text, e.g. compose accents) cannot fit and is not tokenized.
MIN_LINE_BYTES = 16 << 20
JSON_BYTES_PER_CHAR = 12
NORMALIZER_MARGIN = 2
READ_CHUNK_BYTES = 1 << 20
_SURROGATE = re.compile("[\ud800-\udfff]")

CountTokens = Callable[[list[dict], list[dict] | None], int]  # (messages, tools) -> tokens


@dataclass
class Prompt:
    id: str
    index: int
    line: int | None
    messages: list[dict]
    tools: list[dict] | None = None  # function schemas the chat template and the backend see


@dataclass
class BadRow:
    index: int
    line: int | None
    field: str | None
    reason: str
    detail: str

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class LoadedDataset:
    name: str
    prompts: list[Prompt]
    bad_rows: list[BadRow]
    total_rows: int
    skipped_over_cap: int


class _Bad(Exception):
    """A row that cannot become a prompt; caught per row and turned into a BadRow."""

    def __init__(self, reason: str, field: str | None, detail: str) -> None:
        super().__init__(detail)
        self.reason, self.field, self.detail = reason, field, detail


# --- sources ---------------------------------------------------------------------------


@dataclass
class _Source:
    rows: Iterator[tuple[int | None, Any]]  # (1-based line or None, raw row)
    total: int | None  # row count when known without reading the rows
    path: Path

    def sha256(self) -> str:
        """The content hash of what was read (a file or directory read by a library: hashed
        again once it is read)."""
        return source_sha256(self.path)

    def close(self) -> None:
        pass


@dataclass
class _JsonlSource(_Source):
    reader: HashingReader | None = None
    handle: BinaryIO | None = None

    def sha256(self) -> str:
        return self.reader.sha256()  # the bytes the rows were parsed from, read once

    def close(self) -> None:
        self.handle.close()


@dataclass
class _LongLine:
    """A JSONL line longer than the line bound, read past without being kept."""

    size: int
    limit: int


def _open_source(name: str, path: Path, split: str | None, max_line_bytes: int) -> _Source:
    if not path.exists():
        raise DatasetError(f"dataset {name!r}: {path} does not exist")
    if path.is_dir():
        return _hf_source(name, path, split)
    suffix = path.suffix.lower()
    if suffix in JSONL_SUFFIXES:
        handle = path.open("rb")
        reader = HashingReader(handle)
        return _JsonlSource(_jsonl_rows(reader, max_line_bytes), None, path, reader, handle)
    if suffix == ".parquet":
        return _parquet_source(name, path)
    raise DatasetError(
        f"dataset {name!r}: {path}: unsupported file type {suffix or '(none)'!r} "
        "(expected .jsonl, .json, .parquet or a save_to_disk directory)"
    )


def _jsonl_rows(f: HashingReader, max_line_bytes: int) -> Iterator[tuple[int, bytes | _LongLine]]:
    # Bytes, not text: a line of invalid UTF-8 must be a bad row, not a crash.
    for number, raw in enumerate(iter(lambda: f.readline(max_line_bytes + 1), b""), start=1):
        if len(raw) > max_line_bytes and not raw.endswith(b"\n"):
            yield number, _LongLine(len(raw) + _skip_line(f), max_line_bytes)
            continue
        if number == 1 and raw.startswith(UTF8_BOM):
            raw = raw[len(UTF8_BOM) :]
        if raw.strip():
            yield number, raw.rstrip(b"\r\n")


def _skip_line(f: HashingReader) -> int:
    """Read to the end of the current line in bounded chunks; the bytes before its end."""
    skipped = 0
    while chunk := f.readline(READ_CHUNK_BYTES):
        if chunk.endswith(b"\n"):
            return skipped + len(chunk.rstrip(b"\r\n"))
        skipped += len(chunk)
    return skipped


def _parquet_source(name: str, path: Path) -> _Source:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        file = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as exc:
        raise DatasetError(f"dataset {name!r}: {path}: not a readable Parquet file: {exc}") from exc

    def rows() -> Iterator[tuple[None, dict]]:
        for batch in file.iter_batches(batch_size=PARQUET_BATCH_ROWS):
            for row in batch.to_pylist():
                yield None, row

    return _Source(rows(), file.metadata.num_rows, path)


def _hf_source(name: str, path: Path, split: str | None) -> _Source:
    import datasets

    try:
        loaded = datasets.load_from_disk(str(path))
    except FileNotFoundError as exc:
        raise DatasetError(
            f"dataset {name!r}: {path}: not a directory written by datasets' save_to_disk: {exc}"
        ) from exc
    if isinstance(loaded, datasets.DatasetDict):
        loaded = _pick_split(name, path, loaded, split)
    # A saved format (e.g. torch) would turn strings into tensors; read plain Python.
    table = loaded.with_format(None)
    return _Source(((None, row) for row in table), len(table), path)


def _pick_split(name: str, path: Path, splits: Any, split: str | None) -> Any:
    available = ", ".join(sorted(splits))
    if split is None:
        raise DatasetError(
            f"dataset {name!r}: {path} is a DatasetDict with splits [{available}]; "
            f"set datasets.{name}.split to one of them"
        )
    if split not in splits:
        raise DatasetError(f"dataset {name!r}: {path}: split {split!r} not found (available: {available})")
    return splits[split]


def _as_object(raw: Any) -> dict:
    if isinstance(raw, _LongLine):
        detail = f"line has {raw.size} bytes, over the {raw.limit}-byte bound on a row (not parsed)"
        raise _Bad("over-long", None, detail)
    if isinstance(raw, bytes):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _Bad("invalid-utf8", None, f"invalid UTF-8 at byte {exc.start}") from None
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            detail = f"invalid JSON: {exc.msg} (column {exc.colno})"
            raise _Bad("bad-json", None, detail) from None
        except RecursionError:
            raise _Bad("bad-json", None, "invalid JSON: nested too deeply to parse") from None
    if not isinstance(raw, dict):
        raise _Bad("not-an-object", None, f"expected a JSON object, got {type(raw).__name__}")
    return raw


# --- row formats -----------------------------------------------------------------------

# Chat roles a source role may map to; `tool_call` is an assistant turn whose text is the
# JSON of its call(s) (ShareGPT variants such as `function_call`).
CHAT_ROLES = ("system", "user", "assistant", "tool", "tool_call")


@dataclass(frozen=True)
class _Layout:
    """Where a conversation format keeps its turns, roles and texts."""

    turns: str
    role: str
    content: str
    roles: dict[str, str]  # source role name -> one of CHAT_ROLES

    def with_roles(self, extra: dict[str, str] | None) -> _Layout:
        """This layout with a dataset's role map (`datasets.<name>.roles`) over its own."""
        return _Layout(self.turns, self.role, self.content, self.roles | (extra or {}))


_LAYOUTS = {
    "sharegpt": _Layout(
        "conversations",
        "from",
        "value",
        {
            "system": "system",
            "human": "user",
            "user": "user",
            "gpt": "assistant",
            "assistant": "assistant",
            "tool": "tool",
        },
    ),
    "messages": _Layout(
        "messages",
        "role",
        "content",
        {"system": "system", "user": "user", "assistant": "assistant", "tool": "tool"},
    ),
}


def _string(value: Any, field: str) -> str:
    if value is None:
        raise _Bad("missing-field", field, "field is missing")
    if not isinstance(value, str):
        raise _Bad("wrong-type", field, f"expected a string, got {type(value).__name__}")
    return _unicode(value, field)


def _text(value: Any, field: str, empty_reason: str) -> str:
    text = _string(value, field)
    if not text.strip():
        raise _Bad(empty_reason, field, "text is empty")
    return text


def _unicode(text: str, field: str) -> str:
    # JSON may escape half a surrogate pair ("\\ud800"): not text any tokenizer accepts.
    if (lone := _SURROGATE.search(text)) is not None:
        detail = f"lone surrogate {lone.group()!r} at character {lone.start() + 1}: not encodable as UTF-8"
        raise _Bad("invalid-utf8", field, detail)
    return text


def _prompt_messages(row: dict, prompt_field: str) -> list[dict[str, str]]:
    user = _text(row.get(prompt_field), prompt_field, "empty-prompt")
    system = row.get("system")
    # Tabular sources fill absent columns with null, so null or blank means "no system".
    if system is not None and not isinstance(system, str):
        raise _Bad("wrong-type", "system", f"expected a string, got {type(system).__name__}")
    if system:
        _unicode(system, "system")
    messages = [{"role": "system", "content": system}] if system and system.strip() else []
    return [*messages, {"role": "user", "content": user}]


def _object(value: Any, field: str) -> dict:
    if not isinstance(value, dict):
        raise _Bad("not-an-object", field, f"expected an object, got {type(value).__name__}")
    return value


def _json_value(value: Any, field: str) -> Any:
    """A JSON-encoded string decoded (sources store calls and schemas either way)."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        raise _Bad("bad-json", field, f"not valid JSON: {exc.msg} (column {exc.colno})") from None
    except RecursionError:
        raise _Bad("bad-json", field, "not valid JSON: nested too deeply to parse") from None


def _function(obj: dict, field: str) -> tuple[dict, str]:
    """The function of a call or schema, OpenAI-wrapped (`{function: ...}`) or bare; its field."""
    if "function" in obj:
        return _object(obj["function"], f"{field}.function"), f"{field}.function"
    return obj, field


def _tool_call(call: Any, field: str) -> dict:
    """One call in the shape chat templates read: `{type, function: {name, arguments}}`,
    arguments decoded to an object (OpenAI sends them as a JSON string); `id` kept."""
    call = _object(call, field)
    function, where = _function(call, field)
    name = _text(function.get("name"), f"{where}.name", "empty-message")
    arguments = _object(
        _json_value(function.get("arguments", {}), f"{where}.arguments"), f"{where}.arguments"
    )
    out = {"type": "function", "function": {"name": name, "arguments": arguments}}
    if call.get("id") is not None:
        out["id"] = _string(call["id"], f"{field}.id")
    return out


def _tool_calls(value: Any, field: str) -> list[dict]:
    calls = _json_value(value, field)
    calls = [calls] if isinstance(calls, dict) else calls
    if not isinstance(calls, list) or not calls:
        raise _Bad("wrong-type", field, "expected a non-empty list of tool calls")
    return [_tool_call(call, f"{field}[{i}]") for i, call in enumerate(calls)]


def structured_calls(value: Any) -> list[dict] | None:
    """Tool calls a backend returned (a list of calls or its JSON) in the shape datasets keep
    them; None, with a warning, when they do not parse (the text stays the reply)."""
    try:
        return _tool_calls(value, "tool_calls")
    except _Bad as exc:
        log.warning("tool calls that do not parse are kept as text: %s: %s", exc.field, exc.detail)
        return None


def tools_of(row: dict) -> list[dict] | None:
    """The row's `tools` column (function schemas, a list or its JSON), each as
    `{type: function, function: {name, ...}}`; None when absent or empty."""
    tools = _json_value(row.get("tools"), "tools")
    if not tools:
        return None
    if not isinstance(tools, list):
        raise _Bad("wrong-type", "tools", f"expected a list, got {type(tools).__name__}")
    return [_tool_schema(tool, f"tools[{i}]") for i, tool in enumerate(tools)]


def _tool_schema(tool: Any, field: str) -> dict:
    function, where = _function(_object(tool, field), field)
    _text(function.get("name"), f"{where}.name", "empty-message")
    return {"type": "function", "function": function}


def _role(turn: Any, i: int, layout: _Layout) -> str:
    where = f"{layout.turns}[{i}]"
    turn = _object(turn, where)
    raw = turn.get(layout.role)
    field = f"{where}.{layout.role}"
    if raw is None:
        raise _Bad("missing-field", field, "field is missing")
    if not isinstance(raw, str) or raw not in layout.roles:
        allowed = ", ".join(layout.roles)
        raise _Bad("wrong-role", field, f"unknown role {raw!r} (allowed: {allowed})")
    role = layout.roles[raw]
    return "tool_call" if role == "assistant" and turn.get("tool_calls") else role


# The turn each kind of turn may follow ("start": first after an optional system turn).
_FOLLOWS = {
    "user": ("start", "assistant"),
    "assistant": ("user", "tool"),
    "tool_call": ("user", "tool"),
    "tool": ("tool_call", "tool"),
}


def _check_order(roles: list[str], layout: _Layout) -> None:
    """System only first; then user, and each turn after one it may follow: a reply after a
    user or tool turn, tool results after a tool call, a user turn after a reply."""
    start = 1 if roles[:1] == ["system"] else 0
    if "user" not in roles[start:]:
        raise _Bad("no-user-turn", layout.turns, "conversation has no user turn")
    previous = "start"
    for i in range(start, len(roles)):
        field = f"{layout.turns}[{i}].{layout.role}"
        if roles[i] == "system":
            raise _Bad("wrong-role", field, "a system message is only allowed first")
        if previous not in _FOLLOWS[roles[i]]:
            where = "come first" if previous == "start" else f"follow the {previous} turn"
            raise _Bad("wrong-role", field, f"a {roles[i]} turn cannot {where}")
        previous = roles[i]


def _message(turn: dict, role: str, field: str, layout: _Layout, empty_reason: str) -> dict:
    """One turn as a chat message: texts checked, tool calls decoded, reasoning kept."""
    content = turn.get(layout.content)
    if role in ("system", "user"):
        return {"role": role, "content": _text(content, f"{field}.{layout.content}", empty_reason)}
    if role == "tool":
        message = {"role": "tool", "content": _string(content, f"{field}.{layout.content}")}
        for key in ("tool_call_id", "name"):
            if turn.get(key) is not None:
                message[key] = _string(turn[key], f"{field}.{key}")
        return message
    if role == "tool_call" and "tool_calls" not in turn:  # ShareGPT: the call is the text
        return {
            "role": "assistant",
            "content": "",
            "tool_calls": _tool_calls(content, f"{field}.{layout.content}"),
        }
    message = {"role": "assistant"}
    if role == "tool_call":
        message["content"] = "" if content is None else _string(content, f"{field}.{layout.content}")
        message["tool_calls"] = _tool_calls(turn["tool_calls"], f"{field}.tool_calls")
    else:
        message["content"] = _text(content, f"{field}.{layout.content}", "empty-message")
    if turn.get("reasoning_content"):
        message["reasoning_content"] = _string(turn["reasoning_content"], f"{field}.reasoning_content")
    return message


def _conversation_messages(row: dict, layout: _Layout, every_turn: bool) -> list[dict]:
    """The conversation up to its last user or tool turn (the target regenerates the reply
    after it); with `every_turn`, all of it (the target regenerates each assistant turn).

    Every turn's role is checked, but only the kept turns' contents: the rest is discarded.
    """
    turns = row.get(layout.turns)
    if turns is None:
        raise _Bad("missing-field", layout.turns, "field is missing")
    if not isinstance(turns, list):
        raise _Bad("wrong-type", layout.turns, f"expected a list, got {type(turns).__name__}")
    roles = [_role(turn, i, layout) for i, turn in enumerate(turns)]
    _check_order(roles, layout)
    last = (
        len(turns) - 1 if every_turn else max(i for i, role in enumerate(roles) if role in ("user", "tool"))
    )
    return [
        _message(
            turns[i],
            roles[i],
            f"{layout.turns}[{i}]",
            layout,
            "empty-prompt" if i == last else "empty-message",
        )
        for i in range(last + 1)
    ]


def _extractor(name: str, entry: dict) -> Callable[[dict], list[dict]]:
    fmt = entry["format"]
    if fmt == "prompt":
        field = entry.get("prompt_field") or "prompt"
        return lambda row: _prompt_messages(row, field)
    if fmt in _LAYOUTS:
        layout = _LAYOUTS[fmt].with_roles(entry.get("roles"))
        every_turn = entry.get("regenerate") == "every_turn"
        return lambda row: _conversation_messages(row, layout, every_turn)
    raise DatasetError(f"dataset {name!r}: unknown format {fmt!r} (expected prompt, sharegpt, messages)")


def _with_system(messages: list[dict], system_prompt: Any) -> list[dict]:
    # None leaves the choice to the chat template, which may add its own default.
    if isinstance(system_prompt, str) and messages[0]["role"] != "system":
        return [{"role": "system", "content": system_prompt}, *messages]
    return messages


# --- loading ---------------------------------------------------------------------------


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
            raise _Bad(
                "over-long",
                self.field,
                f"prompt has {chars} characters, over the {self.max_chars} that max_prompt_tokens "
                f"{self.max_tokens} allows (not tokenized)",
            )
        count = self.count_tokens(messages, tools)
        if count > self.max_tokens:
            detail = f"prompt has {count} tokens, over max_prompt_tokens {self.max_tokens}"
            raise _Bad("over-long", self.field, detail)


def _length(entry: dict, count_tokens: CountTokens | None, max_token_chars: int | None) -> _Length:
    limit = entry.get("max_prompt_tokens", DEFAULT_MAX_PROMPT_TOKENS)
    counted = count_tokens is not None and max_token_chars is not None
    max_chars = limit * max_token_chars * NORMALIZER_MARGIN if counted else None
    fmt = entry["format"]
    field = (entry.get("prompt_field") or "prompt") if fmt == "prompt" else _LAYOUTS[fmt].turns
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
    extract = _extractor(name, entry)
    length = _length(entry, count_tokens, max_token_chars)
    max_line_bytes = max(MIN_LINE_BYTES, JSON_BYTES_PER_CHAR * (length.max_chars or 0))
    source = _open_source(name, path, entry.get("split"), max_line_bytes)
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
    name: str, path: Path, source: _Source, extract: Callable, length: _Length, entry: dict
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
            row = _as_object(raw)
            messages = _with_system(extract(row), system_prompt)
            tools = tools_of(row)
            length.check(messages, tools)
        except _Bad as exc:
            bad.append(BadRow(index, line, exc.field, exc.reason, exc.detail))
            log.warning("%s: %s", name, _describe(path, bad[-1]))
            continue
        prompts.append(Prompt(f"{name}-{index:06d}", index, line, messages, tools))
        if cap is not None and len(prompts) >= cap:
            break
    return prompts, bad, inspected, _count_rest(source, inspected)


def _count_rest(source: _Source, inspected: int) -> int:
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
