"""Tokenize generated conversations with the target's chat template.

The supervised span is located by character position in the rendered
conversation (the assistant reply plus its end-of-turn token), never by
hard-coded strings. The prompt and that span are tokenized apart: without a
special token between them BPE can merge across the boundary (a prompt ending
in '\n' and a reply starting with whitespace), which would change the prompt's
last id and drop the reply's first characters from the mask. When the
generator reported token ids they are used as is (re-tokenizing changes 0.5-7%
of responses); the encode(decode(ids)) mismatch rate is reported either way.

Special-token text (`<|im_end|>` typed out) is treated as serving treats it: in the
prompt it becomes control tokens, since a server renders the template over the
message text and tokenizes the whole string; in the reply (and its reasoning) it is
ordinary text, since a server strips special ids from the reply text it returns, so
such text was written with ordinary tokens. Both are counted.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import NamedTuple

from draftsmith.errors import TokenizeError
from draftsmith.formats.merged import conversation_of
from draftsmith.formats.responses import reply_message
from draftsmith.target import special_tokens

log = logging.getLogger(__name__)


@dataclass
class TokenizeStats:
    samples: int = 0
    dropped_no_supervised: int = 0
    truncated: int = 0
    tokens: int = 0
    supervised_tokens: int = 0
    with_backend_ids: int = 0
    retokenized: int = 0
    roundtrip_checked: int = 0
    roundtrip_mismatch: int = 0
    special_boundary_violations: int = 0
    prompts_with_special_text: int = 0
    replies_with_special_text: int = 0
    turns_joined: int = 0  # turn records trained inside their conversation's next sample
    dropped_ids: list[str] = field(default_factory=list)

    def add(self, other: TokenizeStats) -> None:
        """Counts of another part of the same dataset, appended."""
        for name, value in other.__dict__.items():
            setattr(self, name, getattr(self, name) + value)

    def as_dict(self) -> dict:
        out = dict(self.__dict__)
        out["roundtrip_mismatch_rate"] = (
            self.roundtrip_mismatch / self.roundtrip_checked if self.roundtrip_checked else None
        )
        return out


class Rendered(NamedTuple):
    """A conversation rendered by the template: the prompt text, the full text, the
    supervised character span [start, end) and, inside it, the spans of message content
    (the reply and, where the template renders it, the reasoning)."""

    prompt_text: str
    full_text: str
    start: int
    end: int
    content: list[tuple[int, int]]


class ChatTokenizer:
    def __init__(self, tokenizer, eot_ids: list[int], max_length: int) -> None:
        self.tokenizer = tokenizer
        self.eot_ids = list(eot_ids)
        self.eot_text = tokenizer.decode(self.eot_ids)
        self.max_length = max_length
        self._special_split = special_tokens.text_pattern(tokenizer)
        self._special_ids = set(special_tokens.special_vocab(tokenizer).values())

    def _ids(self, text: str) -> list[int]:
        """Special-token text becomes control tokens: the template's own markup."""
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def _text_ids(self, text: str) -> list[int]:
        return special_tokens.encode_as_text(self.tokenizer, text)

    def has_special_text(self, text: str | None) -> bool:
        return bool(text) and self._special_split.search(text) is not None

    def render(self, record: dict) -> Rendered:
        """The record's turn as serving renders it: the context with the generation prompt
        must be a prefix of the conversation that includes the turn, else the model would
        be trained on text it never sees (an error naming the record and the turn)."""
        tools = record.get("tools")
        template = self.tokenizer.apply_chat_template
        prompt_text = template(record["messages"], tools=tools, tokenize=False, add_generation_prompt=True)
        full_text = template([*record["messages"], reply_message(record)], tools=tools, tokenize=False)
        where = f"{record['id']} turn {len(record['messages'])}"
        if not full_text.startswith(prompt_text):
            raise TokenizeError(
                f"{where}: the template renders the context differently once this turn follows; "
                "training text would not be serving text"
            )
        reply_at = full_text.find(record["response"], len(prompt_text))
        if reply_at < 0:
            raise TokenizeError(f"{where}: the rendered conversation does not contain the reply")
        end = reply_at + len(record["response"])
        content = [(reply_at, end), *self._reasoning_span(record, full_text, len(prompt_text), reply_at)]
        if record["finish_reason"] != "length":
            end = self._turn_end(record, full_text, end, where)
        return Rendered(prompt_text, full_text, len(prompt_text), end, content)

    def _turn_end(self, record: dict, full_text: str, reply_end: int, where: str) -> int:
        """The end of the turn's end-of-turn text: right after the reply, or after the tool
        calls the template renders there."""
        at = full_text.find(self.eot_text, reply_end) if record.get("tool_calls") else reply_end
        if at < 0 or not full_text.startswith(self.eot_text, at):
            raise TokenizeError(f"{where}: no end-of-turn {self.eot_text!r} after the reply")
        return at + len(self.eot_text)

    @staticmethod
    def _reasoning_span(record: dict, full_text: str, start: int, reply_at: int) -> list[tuple[int, int]]:
        """Where the template rendered the reasoning before the reply (as is, or stripped,
        as some templates do); none where it does not render it."""
        reasoning = record.get("reasoning") or ""
        for text in dict.fromkeys((reasoning, reasoning.strip())):
            at = full_text.find(text, start, reply_at) if text else -1
            if at >= 0:
                return [(at, at + len(text))]
        return []

    def supervised_ids(self, rendered: Rendered) -> list[int]:
        """Ids of the supervised span: the template's special tokens stay control tokens,
        special-token text inside message content is tokenized as text. Splitting at the
        template's special tokens changes nothing else, as BPE does not merge across them."""
        text, at, ids = rendered.full_text, rendered.start, []
        for match in self._special_split.finditer(text, rendered.start, rendered.end):
            if any(a < match.end() and match.start() < b for a, b in rendered.content):
                continue
            ids += self._text_ids(text[at : match.start()]) + self._ids(match.group())
            at = match.end()
        return ids + self._text_ids(text[at : rendered.end])

    def boundary_ok(self, text: str, ids: list[int]) -> bool:
        """BPE must not merge across special tokens: segment-wise ids equal whole-text ids."""
        pieces = [p for p in self._special_split.split(text) if p]
        return [i for p in pieces for i in self._ids(p)] == ids

    def roundtrip_ok(self, ids: list[int]) -> bool:
        """encode(decode(ids)) == ids, as the reply would be re-tokenized: each run of
        ordinary ids between special ids, decoded, encodes back as text to the same ids."""
        run: list[int] = []
        for token_id in [*ids, None]:
            if token_id is not None and token_id not in self._special_ids:
                run.append(token_id)
                continue
            if run and self._text_ids(self.tokenizer.decode(run)) != run:
                return False
            run = []
        return True

    def count_special_text(self, record: dict, stats: TokenizeStats) -> None:
        if any(self.has_special_text(m.get("content")) for m in record["messages"]):
            stats.prompts_with_special_text += 1
        if self.has_special_text(record["response"]) or self.has_special_text(record.get("reasoning")):
            stats.replies_with_special_text += 1

    def encode(self, record: dict, stats: TokenizeStats) -> dict | None:
        rendered = self.render(record)
        full_text, end = rendered.full_text, rendered.end
        if not self.boundary_ok(full_text[:end], self._ids(full_text[:end])):
            stats.special_boundary_violations += 1
        self.count_special_text(record, stats)
        # The prompt ids are what a server conditions on: it tokenizes the rendered prompt
        # whole, so special-token text in a message becomes control tokens there too.
        prompt_ids, supervised_ids = self._ids(rendered.prompt_text), self.supervised_ids(rendered)
        ids = prompt_ids + supervised_ids
        mask = [0] * len(prompt_ids) + [1] * len(supervised_ids)
        backend_ids = record.get("response_token_ids")
        if backend_ids is not None:
            stats.with_backend_ids += 1
            ids, mask = self._from_backend_ids(record, rendered.prompt_text, backend_ids, stats)
        else:
            stats.retokenized += 1
        if len(ids) > self.max_length:
            stats.truncated += 1
            ids, mask = ids[: self.max_length], mask[: self.max_length]
        stats.samples += 1
        if not any(mask):
            stats.dropped_no_supervised += 1
            stats.dropped_ids.append(record["id"])
            return None
        stats.tokens += len(ids)
        stats.supervised_tokens += sum(mask)
        return {
            "id": record["id"],
            "dataset": record["dataset"],
            "input_ids": ids,
            "loss_mask": mask,
        }

    def _from_backend_ids(
        self, record: dict, prompt_text: str, response_ids: list[int], stats: TokenizeStats
    ) -> tuple[list[int], list[int]]:
        prompt_ids = record.get("prompt_token_ids") or self._ids(prompt_text)
        response_ids = list(response_ids)
        if record["finish_reason"] != "length" and response_ids[-len(self.eot_ids) :] != self.eot_ids:
            response_ids += self.eot_ids
        text_ids = response_ids[: -len(self.eot_ids)] if record["finish_reason"] != "length" else response_ids
        stats.roundtrip_checked += 1
        if not self.roundtrip_ok(text_ids):
            stats.roundtrip_mismatch += 1
        return prompt_ids + response_ids, [0] * len(prompt_ids) + [1] * len(response_ids)


def _encode_all(records: list[dict], chat: ChatTokenizer) -> tuple[list[dict], TokenizeStats]:
    stats = TokenizeStats()
    samples: list[dict] = []
    for record in records:
        if (sample := chat.encode(record, stats)) is not None:
            _append_turn(samples, sample, stats)
    return samples, stats


def _append_turn(samples: list[dict], sample: dict, stats: TokenizeStats) -> None:
    """A conversation's next turn joins its previous turn's sample when that sample's ids
    are a prefix of the turn's context: the model was served exactly that text when it
    wrote the turn, so one sample trains both turns. Where the template renders the earlier
    turn otherwise (it drops earlier reasoning, or re-tokenizes a reply differently from
    the ids the backend returned) the turn stays a sample of its own, with its own context."""
    last = samples[-1] if samples else None
    if (
        last is None
        or conversation_of(last["id"]) != conversation_of(sample["id"])
        or sample["input_ids"][: len(last["input_ids"])] != last["input_ids"]
    ):
        samples.append(sample)
        return
    size = len(last["input_ids"])
    samples[-1] = sample | {"loss_mask": last["loss_mask"] + sample["loss_mask"][size:]}
    stats.tokens -= size
    stats.turns_joined += 1


_worker_chat: ChatTokenizer | None = None


def _start_worker(chat: ChatTokenizer) -> None:
    global _worker_chat
    _worker_chat = chat


def _encode_in_worker(records: list[dict]) -> tuple[list[dict], TokenizeStats]:
    assert _worker_chat is not None
    return _encode_all(records, _worker_chat)


def _encode_in_workers(
    records: list[dict], chat: ChatTokenizer, workers: int, chunk: int
) -> tuple[list[dict], TokenizeStats]:
    """Chunks of records in forked worker processes, results in input order. Forked, since
    a spawned worker re-runs the main module (a Snakemake job's script); the tokenizer
    encodes one text at a time, so no thread pool of its own is forked mid-use."""
    chunks = [records[i : i + chunk] for i in range(0, len(records), chunk)]
    samples: list[dict] = []
    stats = TokenizeStats()
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    fork = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(workers, mp_context=fork, initializer=_start_worker, initargs=(chat,)) as pool:
        for part, part_stats in pool.map(_encode_in_worker, chunks):
            samples += part
            stats.add(part_stats)
    return samples, stats


def tokenize_records(
    records,
    chat: ChatTokenizer,
    dataset: str,
    workers: int = 1,
    chunk: int = 1000,
    min_supervised_share: float = 0.0,
) -> tuple[list[dict], TokenizeStats]:
    """Every record's sample (those without supervised tokens dropped) and the counts.
    With `workers` > 1 and more than `chunk` records, chunks run in worker processes;
    the result is the same as in one process. A dataset whose supervised share of its
    samples' tokens is below `min_supervised_share` is an error (a template that marks
    too little, or prompts that crowd out the replies), before any state is extracted."""
    records = list(records)
    if workers > 1 and len(records) > chunk:
        samples, stats = _encode_in_workers(records, chat, workers, chunk)
    else:
        samples, stats = _encode_all(records, chat)
    if stats.special_boundary_violations:
        raise TokenizeError(
            f"{dataset}: {stats.special_boundary_violations} sample(s) where tokenization merged across a "
            "special token; segment-wise and whole-text ids differ, so masks would be wrong"
        )
    if stats.supervised_tokens == 0:
        raise TokenizeError(f"{dataset}: the chat template yields zero supervised tokens")
    share = stats.supervised_tokens / stats.tokens
    if share < min_supervised_share:
        raise TokenizeError(
            f"dataset {dataset!r}: supervised share {share:.2%} ({stats.supervised_tokens} of "
            f"{stats.tokens} tokens) is below min_supervised_share {min_supervised_share:.2%}"
        )
    if stats.prompts_with_special_text or stats.replies_with_special_text:
        log.warning(
            "%s: special-token text in %d prompt(s) (control tokens, as a server reads them) and "
            "%d reply(ies) (plain text, as the model wrote it)",
            dataset,
            stats.prompts_with_special_text,
            stats.replies_with_special_text,
        )
    return samples, stats
