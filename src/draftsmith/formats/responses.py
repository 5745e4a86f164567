"""The response record, shared by every backend and by the tokenize stage."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def add(self, other: Usage) -> None:
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens


def response_record(
    *,
    prompt_id: str,
    dataset: str,
    index: int,
    messages: list[dict],
    response: str,
    finish_reason: str | None,
    usage: Usage,
    reasoning: str | None = None,
    response_token_ids: list[int] | None = None,
    prompt_token_ids: list[int] | None = None,
    tools: list[dict] | None = None,
    tool_calls: list[dict] | None = None,
) -> dict[str, Any]:
    """One generated sample.

    `messages` is the prompt conversation (ending with a user or tool turn), `tools` the
    function schemas it was asked with and `tool_calls` the calls the target made, as
    structured calls (`formats.datasets` shape; each kept only when there is one, so that
    an answer without them is stored as before);
    `response_token_ids` are the ids the generator emitted, when it reports them
    (kept so the tokenize stage need not re-tokenize: encode(decode(ids)) != ids
    for a few percent of responses).
    """
    record = {
        "id": prompt_id,
        "dataset": dataset,
        "index": index,
        "messages": messages,
        "response": response,
        "reasoning": reasoning,
        "response_token_ids": response_token_ids,
        "prompt_token_ids": prompt_token_ids,
        "finish_reason": finish_reason,
        "usage": {
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
        },
    }
    extra = {"tools": tools, "tool_calls": tool_calls}
    return record | {name: value for name, value in extra.items() if value}


def reply_message(record: dict) -> dict:
    """The assistant turn a record's answer makes, as chat templates and APIs read it: the
    reply, its reasoning and its tool calls (each only when there is one)."""
    reply = {"role": "assistant", "content": record["response"]}
    if record.get("reasoning"):
        reply["reasoning_content"] = record["reasoning"]
    if record.get("tool_calls"):
        reply["tool_calls"] = record["tool_calls"]
    return reply


def record_usage(record: dict) -> Usage:
    return Usage(**record["usage"])
