"""Generation through an OpenAI-compatible `/chat/completions` server.

Works against SGLang, vLLM, `transformers serve` and hosted APIs. Requests run
concurrently on one asyncio loop; transient failures (429, 5xx, resets,
timeouts, garbage bodies) are retried with capped exponential backoff; a spend
cap stops cleanly with everything finished so far already emitted. A prompt
that fails for good stops the run at once: requests still in flight are
abandoned, and their prompts are sent again by the next run.

The API key is read from the environment only and never reaches a log line,
an exception message or a record: a key that is not one word of visible ASCII
(a key copied from a CRLF file ends in a carriage return) is refused before any
request, messages built from server or client text are redacted (escaped forms
included), and httpx/httpcore log records are filtered while a run is active.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import logging
import os
import random
import re
import time
import urllib.parse
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import httpx

from draftsmith.errors import BudgetReached, GenerationError
from draftsmith.formats.datasets.conversations import structured_calls
from draftsmith.formats.responses import Usage, response_record

if TYPE_CHECKING:
    from draftsmith.formats.datasets.rows import Prompt
    from draftsmith.responses.settings import OpenAIGeneration, Sampling

log = logging.getLogger(__name__)

REDACTED = "[REDACTED]"
# Runs of a key between escaped characters at least this long are redacted on their own.
MIN_SECRET_PART = 8
_NOT_VISIBLE = re.compile(r"[^!-~]+")
ERROR_EXCERPT_CHARS = 300
# 408/409 are "try again" in practice; other 4xx mean the request itself is wrong.
RETRYABLE_4XX = frozenset({408, 409, 429})
# Loggers that can print request URLs or response headers (a server may echo ours).
HTTP_LOGGERS = (
    "httpx",
    "httpcore.connection",
    "httpcore.http11",
    "httpcore.http2",
    "httpcore.proxy",
    "httpcore.socks",
)
# Asking for token ids: vLLM and SGLang read `return_token_ids` (SGLang also
# `return_prompt_token_ids`). Sent only on request: `transformers serve`
# answers 422 to any field it does not know.
TOKEN_ID_FIELDS = {"return_token_ids": True, "return_prompt_token_ids": True}


def redact(text: str, secret: str | None) -> str:
    """`text` with `secret` replaced in every form a message may print it.

    Forms: as is, escaped (str and bytes repr, JSON, URL and form encoding), and
    each long run of visible ASCII between characters that those forms escape:
    `b'Bearer sk-...\\r'` keeps the key's body verbatim, only its end escaped.
    """
    if not secret:
        return text
    for form in _secret_forms(secret):
        text = text.replace(form, REDACTED)
    return text


def _secret_forms(secret: str) -> list[str]:
    parts = {secret, *(p for p in _NOT_VISIBLE.split(secret) if len(p) >= MIN_SECRET_PART)}
    forms = set()
    for part in parts:
        forms |= {
            part,
            repr(part)[1:-1],
            repr(part.encode("utf-8", "surrogatepass"))[2:-1],
            json.dumps(part)[1:-1],
            urllib.parse.quote(part, safe=""),
            urllib.parse.quote_plus(part),
        }
    # Longest first: a whole form goes before a part of it is cut out of it.
    return sorted(forms - {""}, key=len, reverse=True)


def check_key(key: str, variable: str) -> None:
    """Refuse a key that is not one word of visible ASCII, before any request: HTTP
    rejects it in a header (and prints the header, key included). The message names the
    variable and the character at fault, never the key."""
    for position, char in enumerate(key, start=1):
        if not _NOT_VISIBLE.fullmatch(char):
            continue
        raise GenerationError(
            f"the API key in the environment variable {variable} (generation.openai.api_key_env) "
            f"holds {_character(char)} at character {position} of {len(key)}: an API key is one "
            "word of visible ASCII characters (a key copied from a file with Windows line ends "
            "ends in a carriage return); set the variable to the key alone"
        )


def _character(char: str) -> str:
    named = {"\r": "a carriage return", "\n": "a line feed", "\t": "a tab", " ": "a space"}
    if char in named:
        return named[char]
    if char.isascii():
        return f"a control character (U+{ord(char):04X})"
    return "whitespace" if char.isspace() else "a non-ASCII character"


class _RedactFilter(logging.Filter):
    def __init__(self, secret: str) -> None:
        super().__init__()
        self.secret = secret

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        redacted = redact(message, self.secret)
        if redacted != message:
            record.msg, record.args = redacted, None
        return True


@contextmanager
def _redacted_http_logs(secret: str | None) -> Iterator[None]:
    if not secret:
        yield
        return
    flt = _RedactFilter(secret)
    loggers = [logging.getLogger(name) for name in HTTP_LOGGERS]
    for logger in loggers:
        logger.addFilter(flt)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeFilter(flt)


class _Retryable(Exception):
    """A failed attempt worth repeating; `retry_after` is the server's hint in seconds."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


@dataclass
class _Answer:
    content: str
    reasoning: str | None
    tool_calls: list[dict] | None
    finish_reason: str | None
    usage: Usage
    token_ids: list[int] | None
    prompt_token_ids: list[int] | None


@dataclass
class _RunState:
    spent: Usage
    usage: Usage = field(default_factory=Usage)
    generated: int = 0
    retries: int = 0


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or HTTP date)."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def _token_ids(*candidates: Any) -> list[int] | None:
    """The first candidate that is a list of ints (servers put ids in different places)."""
    for value in candidates:
        if isinstance(value, list) and all(isinstance(v, int) for v in value):
            return value
    return None


class OpenAIBackend:
    """`Backend` for `generation.backend: openai` (and a launched SGLang server).

    `served_model` is the `model` sent when `openai.model` is None.
    """

    def __init__(self, dataset: str, openai: OpenAIGeneration, sampling: Sampling, served_model: str) -> None:
        self.dataset = dataset
        self.cfg = openai
        self.url = openai.base_url.rstrip("/") + "/chat/completions"
        self.model = openai.model or served_model
        self.sampling = sampling
        self.budget = openai.budget_usd
        self.extra_body = openai.extra_fields()
        self._key = self._read_key()
        self._warned_usage = False
        no_prices = not (openai.price_per_million_input or openai.price_per_million_output)
        if self.budget is not None and no_prices:
            log.warning("budget_usd is set but both prices are 0: the cost stays $0")

    def _read_key(self) -> str | None:
        name = self.cfg.api_key_env
        if not name:
            return None
        key = os.environ.get(name)
        if not key:
            raise GenerationError(
                f"generation.openai.api_key_env names the environment variable {name}, "
                "which is not set (or empty)"
            )
        check_key(key, name)
        return key

    # ----- driver -----

    def generate(self, prompts: list[Prompt], emit: Callable[[dict], None], spent: Usage) -> None:
        if not prompts:
            return
        with _redacted_http_logs(self._key):
            asyncio.run(self._run(prompts, emit, spent))

    async def _run(self, prompts: list[Prompt], emit: Callable[[dict], None], spent: Usage) -> None:
        started = time.monotonic()
        state = _RunState(spent=spent)
        queue = deque(prompts)
        workers = min(self.cfg.concurrency, len(prompts))
        async with self._client(workers) as client:
            tasks = [asyncio.create_task(self._worker(client, queue, emit, state)) for _ in range(workers)]
            await _first_error(tasks)
        log.info(
            "%s: %d generated, %d retries, %d prompt + %d completion tokens, $%.4f this run, %.1fs",
            self.dataset,
            state.generated,
            state.retries,
            state.usage.prompt_tokens,
            state.usage.completion_tokens,
            self.cfg.cost_usd(state.usage),
            time.monotonic() - started,
        )
        if queue:
            raise self._budget_error(state, len(queue))

    def _client(self, workers: int) -> httpx.AsyncClient:
        headers = {"Authorization": f"Bearer {self._key}"} if self._key else {}
        return httpx.AsyncClient(
            headers=headers,
            timeout=httpx.Timeout(self.cfg.timeout_s),
            limits=httpx.Limits(max_connections=workers, max_keepalive_connections=workers),
        )

    def _total_cost(self, state: _RunState) -> float:
        total = Usage()
        total.add(state.spent)
        total.add(state.usage)
        return self.cfg.cost_usd(total)

    def _over_budget(self, state: _RunState) -> bool:
        return self.budget is not None and self._total_cost(state) >= self.budget

    async def _worker(
        self,
        client: httpx.AsyncClient,
        queue: deque[Prompt],
        emit: Callable[[dict], None],
        state: _RunState,
    ) -> None:
        # The budget check and popleft run without an await between them, so
        # no worker starts a request after the cap is seen.
        while queue and not self._over_budget(state):
            prompt = queue.popleft()
            answer = await self._complete(client, prompt, state)
            state.usage.add(answer.usage)
            state.generated += 1
            emit(self._record(prompt, answer))

    def _budget_error(self, state: _RunState, remaining: int) -> BudgetReached:
        return BudgetReached(
            f"{self.dataset}: spend cap reached: ${self._total_cost(state):.4f} spent "
            f"of generation.openai.budget_usd=${self.budget:.4f}; {state.generated} "
            f"generated this run, {remaining} prompt(s) not started. Finished samples are "
            "kept: raise budget_usd and rerun to continue."
        )

    def _record(self, prompt: Prompt, answer: _Answer) -> dict:
        return response_record(
            prompt_id=prompt.id,
            dataset=self.dataset,
            index=prompt.index,
            messages=prompt.messages,
            tools=prompt.tools,
            response=answer.content,
            finish_reason=answer.finish_reason,
            usage=answer.usage,
            reasoning=answer.reasoning,
            tool_calls=answer.tool_calls,
            response_token_ids=answer.token_ids,
            prompt_token_ids=answer.prompt_token_ids,
        )

    # ----- one prompt -----

    def _body(self, prompt: Prompt) -> dict:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [_wire_message(m) for m in prompt.messages],
            "max_tokens": self.sampling.max_new_tokens,
            "temperature": self.sampling.temperature,
            "top_p": self.sampling.top_p,
            "seed": self.sampling.seed,
        }
        if prompt.tools:
            body["tools"] = prompt.tools
        if self.cfg.request_token_ids:
            body.update(TOKEN_ID_FIELDS)
        body.update(self.extra_body)
        return body

    async def _complete(self, client: httpx.AsyncClient, prompt: Prompt, state: _RunState) -> _Answer:
        body = self._body(prompt)
        max_retries = self.cfg.max_retries
        for attempt in range(max_retries + 1):
            try:
                return await self._attempt(client, body, prompt)
            except _Retryable as err:
                last = err
                if attempt == max_retries:
                    break
                wait = self._backoff(attempt, err.retry_after)
                state.retries += 1
                log.warning(
                    "%s: prompt %s: %s; retry %d/%d in %.1fs",
                    self.dataset,
                    prompt.id,
                    self._safe(str(err)),
                    attempt + 1,
                    max_retries,
                    wait,
                )
                await asyncio.sleep(wait)
        raise GenerationError(
            self._safe(
                f"{self.dataset}: prompt {prompt.id}: gave up after {max_retries} retries "
                f"against {self.url}; last error: {last}"
            )
        )

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        cap = self.cfg.max_backoff_s
        if retry_after is not None:
            return min(retry_after, cap)
        # Equal jitter: at least half the exponential step, so waits still grow.
        step = min(cap, self.cfg.backoff_s * 2**attempt)
        return step / 2 + random.uniform(0, step / 2)

    async def _attempt(self, client: httpx.AsyncClient, body: dict, prompt: Prompt) -> _Answer:
        timeout = self.cfg.timeout_s
        try:
            # httpx's timeout is per socket operation; this bounds the whole request.
            async with asyncio.timeout(timeout):
                response = await client.post(self.url, json=body)
        except (TimeoutError, httpx.TimeoutException) as err:
            raise _Retryable(f"no answer within timeout_s={timeout} ({type(err).__name__})") from None
        except httpx.UnsupportedProtocol as err:
            raise GenerationError(self._safe(f"generation.openai.base_url: {err}")) from None
        except httpx.RequestError as err:
            # Resets, refused connections, undecodable bodies: all transient from here.
            raise _Retryable(f"connection error: {type(err).__name__}: {err}") from None
        self._check_status(response, prompt)
        return self._parse(response)

    def _check_status(self, response: httpx.Response, prompt: Prompt) -> None:
        status = response.status_code
        if 200 <= status < 300:
            return
        message = f"HTTP {status}: {self._excerpt(response.text)}"
        if status in RETRYABLE_4XX or status >= 500:
            retry_after = parse_retry_after(response.headers.get("retry-after"))
            raise _Retryable(message, retry_after)
        hint = ""
        if status == 422 and self.cfg.request_token_ids:
            hint = " (if the server rejects return_token_ids, set generation.openai.request_token_ids: false)"
        raise GenerationError(
            self._safe(
                f"{self.dataset}: prompt {prompt.id}: {self.url} rejected the request "
                f"(not retried): {message}{hint}"
            )
        )

    def _excerpt(self, text: str) -> str:
        # Redact before cutting, so a key split by the cut cannot leak its prefix.
        text = " ".join(self._safe(text).split())
        if len(text) > ERROR_EXCERPT_CHARS:
            return text[:ERROR_EXCERPT_CHARS] + "..."
        return text or "(empty body)"

    def _safe(self, text: str) -> str:
        return redact(text, self._key)

    # ----- parsing -----

    def _parse(self, response: httpx.Response) -> _Answer:
        try:
            data = response.json()
            choice = data["choices"][0]
            message = choice["message"]
            if not isinstance(message, dict) or not isinstance(message.get("content", ""), str | None):
                raise TypeError("choices[0].message is not a text message")
        except (ValueError, LookupError, TypeError) as err:
            raise _Retryable(
                f"garbage answer ({type(err).__name__}): {self._excerpt(response.text)}"
            ) from None
        meta = choice.get("meta_info") if isinstance(choice.get("meta_info"), dict) else {}
        return _Answer(
            content=message.get("content") or "",
            reasoning=message.get("reasoning_content") or message.get("reasoning") or None,
            tool_calls=structured_calls(message["tool_calls"]) if message.get("tool_calls") else None,
            finish_reason=choice.get("finish_reason"),
            usage=self._usage(data.get("usage")),
            # vLLM and SGLang: choice.token_ids; SGLang's meta_info carries output_ids.
            token_ids=_token_ids(choice.get("token_ids"), meta.get("output_ids")),
            # SGLang puts prompt ids on the choice, vLLM on the response.
            prompt_token_ids=_token_ids(choice.get("prompt_token_ids"), data.get("prompt_token_ids")),
        )

    def _usage(self, usage: Any) -> Usage:
        if isinstance(usage, dict):
            prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
            if isinstance(prompt, int) and isinstance(completion, int):
                return Usage(prompt, completion)
        if not self._warned_usage:
            self._warned_usage = True
            log.warning(
                "%s: the server reports no usage counts; counting 0 tokens "
                "(cost and budget_usd cannot see this spend)",
                self.dataset,
            )
        return Usage()


def _wire_message(message: dict) -> dict:
    """A message as the API takes it: tool-call arguments as a JSON string (datasets keep
    them decoded, as chat templates read them)."""
    if "tool_calls" not in message:
        return message
    calls = [
        call | {"function": call["function"] | {"arguments": json.dumps(call["function"]["arguments"])}}
        for call in message["tool_calls"]
    ]
    return message | {"tool_calls": calls}


async def _first_error(tasks: list[asyncio.Task]) -> None:
    """Wait for all tasks; on the first failure cancel the rest and raise it."""
    done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    for task in done:
        if task.exception() is not None:
            raise task.exception()
