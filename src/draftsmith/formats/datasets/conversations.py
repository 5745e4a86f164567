"""Row formats as chat messages: a prompt field, or a conversation (ShareGPT or
messages) with roles, tool calls, tool turns, reasoning and the row's `tools`."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from draftsmith.errors import DatasetError
from draftsmith.formats.datasets.rows import Bad

log = logging.getLogger(__name__)

_SURROGATE = re.compile("[\ud800-\udfff]")

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


LAYOUTS = {
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
        raise Bad("missing-field", field, "field is missing")
    if not isinstance(value, str):
        raise Bad("wrong-type", field, f"expected a string, got {type(value).__name__}")
    return _unicode(value, field)


def _text(value: Any, field: str, empty_reason: str) -> str:
    text = _string(value, field)
    if not text.strip():
        raise Bad(empty_reason, field, "text is empty")
    return text


def _unicode(text: str, field: str) -> str:
    # JSON may escape half a surrogate pair ("\\ud800"): not text any tokenizer accepts.
    if (lone := _SURROGATE.search(text)) is not None:
        detail = f"lone surrogate {lone.group()!r} at character {lone.start() + 1}: not encodable as UTF-8"
        raise Bad("invalid-utf8", field, detail)
    return text


def _prompt_messages(row: dict, prompt_field: str) -> list[dict[str, str]]:
    user = _text(row.get(prompt_field), prompt_field, "empty-prompt")
    system = row.get("system")
    # Tabular sources fill absent columns with null, so null or blank means "no system".
    if system is not None and not isinstance(system, str):
        raise Bad("wrong-type", "system", f"expected a string, got {type(system).__name__}")
    if system:
        _unicode(system, "system")
    messages = [{"role": "system", "content": system}] if system and system.strip() else []
    return [*messages, {"role": "user", "content": user}]


def _object(value: Any, field: str) -> dict:
    if not isinstance(value, dict):
        raise Bad("not-an-object", field, f"expected an object, got {type(value).__name__}")
    return value


def _json_value(value: Any, field: str) -> Any:
    """A JSON-encoded string decoded (sources store calls and schemas either way)."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        raise Bad("bad-json", field, f"not valid JSON: {exc.msg} (column {exc.colno})") from None
    except RecursionError:
        raise Bad("bad-json", field, "not valid JSON: nested too deeply to parse") from None


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
        raise Bad("wrong-type", field, "expected a non-empty list of tool calls")
    return [_tool_call(call, f"{field}[{i}]") for i, call in enumerate(calls)]


def structured_calls(value: Any) -> list[dict] | None:
    """Tool calls a backend returned (a list of calls or its JSON) in the shape datasets keep
    them; None, with a warning, when they do not parse (the text stays the reply)."""
    try:
        return _tool_calls(value, "tool_calls")
    except Bad as exc:
        log.warning("tool calls that do not parse are kept as text: %s: %s", exc.field, exc.detail)
        return None


def tools_of(row: dict) -> list[dict] | None:
    """The row's `tools` column (function schemas, a list or its JSON), each as
    `{type: function, function: {name, ...}}`; None when absent or empty."""
    tools = _json_value(row.get("tools"), "tools")
    if not tools:
        return None
    if not isinstance(tools, list):
        raise Bad("wrong-type", "tools", f"expected a list, got {type(tools).__name__}")
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
        raise Bad("missing-field", field, "field is missing")
    if not isinstance(raw, str) or raw not in layout.roles:
        allowed = ", ".join(layout.roles)
        raise Bad("wrong-role", field, f"unknown role {raw!r} (allowed: {allowed})")
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
        raise Bad("no-user-turn", layout.turns, "conversation has no user turn")
    previous = "start"
    for i in range(start, len(roles)):
        field = f"{layout.turns}[{i}].{layout.role}"
        if roles[i] == "system":
            raise Bad("wrong-role", field, "a system message is only allowed first")
        if previous not in _FOLLOWS[roles[i]]:
            where = "come first" if previous == "start" else f"follow the {previous} turn"
            raise Bad("wrong-role", field, f"a {roles[i]} turn cannot {where}")
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
        raise Bad("missing-field", layout.turns, "field is missing")
    if not isinstance(turns, list):
        raise Bad("wrong-type", layout.turns, f"expected a list, got {type(turns).__name__}")
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


def extractor(name: str, entry: dict) -> Callable[[dict], list[dict]]:
    fmt = entry["format"]
    if fmt == "prompt":
        field = entry.get("prompt_field") or "prompt"
        return lambda row: _prompt_messages(row, field)
    if fmt in LAYOUTS:
        layout = LAYOUTS[fmt].with_roles(entry.get("roles"))
        every_turn = entry.get("regenerate") == "every_turn"
        return lambda row: _conversation_messages(row, layout, every_turn)
    raise DatasetError(f"dataset {name!r}: unknown format {fmt!r} (expected prompt, sharegpt, messages)")


def with_system(messages: list[dict], system_prompt: Any) -> list[dict]:
    # None leaves the choice to the chat template, which may add its own default.
    if isinstance(system_prompt, str) and messages[0]["role"] != "system":
        return [{"role": "system", "content": system_prompt}, *messages]
    return messages
