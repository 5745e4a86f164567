"""Every assistant turn of a conversation written by the target (`regenerate: every_turn`).

The target writes assistant turn 1 from the conversation up to it, then sees its own reply
and the dataset's next user turn, and so on. Each turn is one request whose prompt (the
messages so far and the tools) has its own address in the answer store, so `walk` replays a
conversation through the answers stored so far and stops at the first turn not answered
yet: a rerun after a kill resumes there, and no finished turn is requested again.

A dataset tool result is kept when the target's calls match the dataset's (same functions
in the same order, JSON-equal arguments); the results then answer the target's own calls
(their ids). Otherwise the conversation ends after that turn, and it is counted.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from draftsmith.formats.datasets.rows import Prompt
from draftsmith.formats.responses import reply_message
from draftsmith.store import answers


@dataclass
class Walk:
    """A conversation replayed through the stored answers."""

    records: list[dict] = field(default_factory=list)  # one response record per answered turn
    pending: Prompt | None = None  # the first turn with no stored answer
    ended_early: bool = False  # the target's calls differed from the dataset's
    calls_matched: int = 0


def turn_id(conversation_id: str, turn: int) -> str:
    """A turn's record id: the conversation's id and the turn's position in it (the
    held-out split reads the conversation's part, `formats.merged.conversation_of`)."""
    return f"{conversation_id}/{turn}"


def calls_match(target: list[dict] | None, dataset: list[dict] | None) -> bool:
    """Same functions in the same order with JSON-equal (decoded) arguments."""
    key = [(c["function"]["name"], c["function"]["arguments"]) for c in target or []]
    return bool(key) and key == [(c["function"]["name"], c["function"]["arguments"]) for c in dataset or []]


def _reply_turns(turns: list[dict]) -> list[int]:
    """Where the target writes: each assistant turn, and a reply after a final user or tool turn."""
    at = [i for i, turn in enumerate(turns) if turn["role"] == "assistant"]
    return at + [len(turns)] if turns[-1]["role"] in ("user", "tool") else at


def walk(conversation: Prompt, store: answers.AnswerStore, dataset: str) -> Walk:
    """Replay `conversation` (every turn of the dataset's row) through `store`."""
    turns, done, context = conversation.messages, Walk(), []
    replies, call_ids = set(_reply_turns(turns)), []
    for i in range(len(turns) + 1):
        if i not in replies:
            if i < len(turns):
                context.append(_answering(turns[i], call_ids))
            continue
        request = Prompt(
            turn_id(conversation.id, i),
            conversation.index,
            conversation.line,
            list(context),
            conversation.tools,
        )
        at = answers.address(request.messages, request.tools)
        if at not in store:
            done.pending = request
            return done
        record = answers.as_record(store.get(at), request.id, dataset, conversation.index)
        done.records.append(record)
        reply = reply_message(record)
        written = turns[i] if i < len(turns) else {}
        follows_tool = turns[i + 1 : i + 2] and turns[i + 1]["role"] == "tool"
        if reply.get("tool_calls") or follows_tool:
            if not calls_match(reply.get("tool_calls"), written.get("tool_calls")):
                done.ended_early = i + 1 < len(turns)
                return done
            done.calls_matched += len(reply["tool_calls"])
            call_ids = [call.get("id") for call in reply["tool_calls"]]
        context.append(reply)
    return done


def _answering(turn: dict, call_ids: list) -> dict:
    """A dataset turn as context; a tool result names the target's call it answers."""
    if turn["role"] != "tool" or not call_ids:
        return turn
    call_id = call_ids.pop(0)
    return turn | {"tool_call_id": call_id} if call_id is not None else turn
