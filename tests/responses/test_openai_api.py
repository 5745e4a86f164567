"""OpenAIBackend against the fault proxy (fast, canned answers) and a real
`transformers serve` (slow)."""

from __future__ import annotations

import email.utils
import json
import logging
import re
import secrets
import time
import traceback
import urllib.parse

import pytest
from conftest import openai_cfg
from fault_proxy import FaultProxy

from draftsmith.errors import BudgetReached, GenerationError
from draftsmith.formats.datasets.rows import Prompt
from draftsmith.formats.responses import Usage
from draftsmith.responses.openai_api import OpenAIBackend, parse_retry_after, redact
from draftsmith.responses.settings import Sampling

GENERATION = Sampling(max_new_tokens=16, temperature=0.0, top_p=1.0, seed=0)


def prompts(*texts: str) -> list[Prompt]:
    return [
        Prompt(id=f"ds-{i}", index=i, line=i + 1, messages=[{"role": "user", "content": t}])
        for i, t in enumerate(texts)
    ]


def run(proxy: FaultProxy, batch: list[Prompt], spent: Usage | None = None, **cfg) -> list[dict]:
    records: list[dict] = []
    backend = OpenAIBackend("ds", openai_cfg(proxy.url, **cfg), GENERATION, "test-model")
    backend.generate(batch, records.append, spent or Usage())
    return records


# ----- success path -----


def test_records_carry_the_answer_and_usage():
    with FaultProxy() as proxy:
        records = run(proxy, prompts("hello there world", "one two"))
    by_id = {r["id"]: r for r in records}
    assert set(by_id) == {"ds-0", "ds-1"}
    first = by_id["ds-0"]
    assert first["dataset"] == "ds" and first["index"] == 0
    assert first["messages"] == [{"role": "user", "content": "hello there world"}]
    assert first["response"] == "echo: world there hello"
    assert first["finish_reason"] == "stop"
    assert first["usage"] == {"prompt_tokens": 3, "completion_tokens": 4}
    assert first["reasoning"] is None and first["response_token_ids"] is None
    body = proxy.bodies[0]
    assert body["model"] == "test-model" and body["max_tokens"] == 16
    assert (body["temperature"], body["top_p"], body["seed"]) == (0.0, 1.0, 0)
    # transformers serve answers 422 to fields it does not know: none by default.
    assert "return_token_ids" not in body


def test_token_ids_reasoning_and_extra_body():
    with FaultProxy() as proxy:
        [record] = run(proxy, prompts("think: a bb ccc"), request_token_ids=True, extra_body={"top_k": 5})
    body = proxy.bodies[0]
    assert body["return_token_ids"] is True and body["top_k"] == 5
    assert record["response_token_ids"] == [5, 3, 2, 1, 6]  # word lengths, canned mode
    assert record["reasoning"] == "thinking about 15 characters"


def test_nothing_to_do_sends_nothing():
    with FaultProxy() as proxy:
        assert run(proxy, []) == []
    assert proxy.total == 0


# ----- retries -----


@pytest.mark.parametrize("fault", ["429", "500", "reset", "slow", "garbage", "no_choices"])
def test_each_fault_is_retried(fault):
    with FaultProxy(retry_after="0", slow_s=3.0) as proxy:
        proxy.script("*", fault)
        records = run(proxy, prompts("a b", "c d"), timeout_s=1.0)
    assert sorted(r["response"] for r in records) == ["echo: b a", "echo: d c"]
    assert proxy.counts == {"a b": 2, "c d": 2}


def test_retry_after_is_honoured():
    with FaultProxy(retry_after="1") as proxy:
        proxy.script("x", "429")
        [record] = run(proxy, prompts("x"), max_backoff_s=10)
    first, second = proxy.times["x"]
    assert second - first >= 1.0
    assert record["response"] == "echo: x"


def test_retry_after_is_capped_by_max_backoff():
    with FaultProxy(retry_after="30") as proxy:
        proxy.script("x", "429")
        started = time.monotonic()
        run(proxy, prompts("x"), max_backoff_s=0.2)
    assert time.monotonic() - started < 5


def test_parse_retry_after_forms():
    now = time.time()
    assert parse_retry_after("2") == 2.0
    assert parse_retry_after(email.utils.formatdate(now + 5, usegmt=True), now=now) == pytest.approx(5, abs=1)
    assert parse_retry_after(email.utils.formatdate(now - 60, usegmt=True), now=now) == 0.0
    assert parse_retry_after("soon") is None and parse_retry_after(None) is None


def test_exhausted_retries_name_the_prompt():
    with FaultProxy() as proxy:
        proxy.script("x", *["500"] * 10)
        with pytest.raises(GenerationError) as caught:
            run(proxy, prompts("x"), max_retries=2)
    message = str(caught.value)
    assert "ds: prompt ds-0" in message and "2 retries" in message and "HTTP 500" in message
    assert proxy.counts["x"] == 3


def test_client_errors_are_not_retried():
    with FaultProxy() as proxy:
        proxy.script("x", "400")
        with pytest.raises(GenerationError) as caught:
            run(proxy, prompts("x"))
    assert "HTTP 400" in str(caught.value) and "not retried" in str(caught.value)
    assert "injected 400" in str(caught.value)  # a body excerpt
    assert proxy.counts["x"] == 1


def test_missing_usage_counts_zero_and_warns_once(caplog, monkeypatch):
    import fault_proxy

    def no_usage(body):
        answer = canned(body)
        del answer["usage"]
        return answer

    canned = fault_proxy.canned_completion
    monkeypatch.setattr(fault_proxy, "canned_completion", no_usage)
    with FaultProxy() as proxy:
        records = run(proxy, prompts("a", "b", "c"))
    assert all(r["usage"] == {"prompt_tokens": 0, "completion_tokens": 0} for r in records)
    assert sum("no usage counts" in m for m in caplog.messages) == 1


# ----- concurrency and budget -----


def test_concurrency_bound():
    with FaultProxy(latency_s=0.1) as proxy:
        records = run(proxy, prompts(*[f"p {i}" for i in range(12)]), concurrency=3)
    assert len(records) == 12
    assert proxy.max_in_flight == 3


def test_budget_stops_cleanly_and_keeps_finished_records():
    # Each answer is 3 completion tokens at $1 each; the first answer crosses
    # the $2 cap while the second request is still in flight.
    emitted: list[dict] = []
    cfg = dict(concurrency=2, price_per_million_output=1e6, budget_usd=2.0)
    with FaultProxy(latency_s=0.2) as proxy:
        backend = OpenAIBackend("ds", openai_cfg(proxy.url, **cfg), GENERATION, "m")
        with pytest.raises(BudgetReached) as caught:
            backend.generate(prompts(*[f"p {i}" for i in range(10)]), emitted.append, Usage())
    assert len(emitted) == 2 == proxy.total  # the in-flight request finished and was kept
    message = str(caught.value)
    assert "$6.0000 spent" in message and "8 prompt(s) not started" in message
    assert "raise budget_usd and rerun" in message


def test_budget_already_spent_sends_nothing():
    with FaultProxy() as proxy, pytest.raises(BudgetReached):
        run(proxy, prompts("a"), spent=Usage(0, 10), price_per_million_output=1e6, budget_usd=5.0)
    assert proxy.total == 0


# ----- the API key -----


def test_missing_key_variable_is_named(monkeypatch):
    monkeypatch.delenv("DS_TEST_NO_SUCH_KEY", raising=False)
    with pytest.raises(GenerationError, match="DS_TEST_NO_SUCH_KEY"):
        OpenAIBackend("ds", openai_cfg("http://x", api_key_env="DS_TEST_NO_SUCH_KEY"), GENERATION, "m")


def test_redact():
    assert redact("a sk-1 b sk-1", "sk-1") == "a [REDACTED] b [REDACTED]"
    assert redact("b'Bearer sk-1'", "sk-1") == "b'Bearer [REDACTED]'"
    assert redact("text", None) == "text"


def test_redact_catches_escaped_and_partial_forms():
    body = "sk-" + secrets.token_hex(8) + "/+=" + secrets.token_hex(8)
    key = body + "\r"
    forms = {
        "as is": key,
        "repr": repr(key),
        "bytes repr": repr(f"Bearer {key}".encode()),
        "JSON": json.dumps({"auth": key}),
        "URL-encoded": urllib.parse.quote(key, safe=""),
        "form-encoded": urllib.parse.quote_plus(key),
        "body alone": f"key {body} here",
    }
    for name, text in forms.items():
        redacted = redact(text, key)
        assert "[REDACTED]" in redacted, name
        assert not [part for part in secrets_of(body) if part in redacted], (name, redacted)


def secrets_of(body: str) -> set[str]:
    """The key's runs of token characters, as a server's error text might split them."""
    return {part for part in re.split(r"[/+=]", body) if len(part) >= 8}


@pytest.mark.parametrize(
    ("suffix", "described"),
    [
        ("\r", "a carriage return"),
        ("\n", "a line feed"),
        (" ", "a space"),
        ("\t", "a tab"),
        ("\x1b", "a control character (U+001B)"),
        ("\u00e9", "a non-ASCII character"),
    ],
)
def test_key_with_whitespace_or_control_characters_is_refused_unseen(monkeypatch, suffix, described):
    body = "sk-test-" + secrets.token_hex(16)
    monkeypatch.setenv("DS_TEST_API_KEY", body + suffix)
    texts: list[str] = []
    with FaultProxy() as proxy, pytest.raises(GenerationError) as caught:
        cfg = openai_cfg(proxy.url, api_key_env="DS_TEST_API_KEY", max_retries=1)
        backend = OpenAIBackend("ds", cfg, GENERATION, "m")
        backend.generate(prompts("hi"), lambda record: None, Usage())
    err = caught.value
    texts += [str(err), repr(err), "".join(traceback.format_exception(err))]
    assert proxy.total == 0  # refused before any request
    assert "DS_TEST_API_KEY" in str(err) and described in str(err)
    assert not [t for t in texts if body in t or body[8:] in t]


def test_key_never_leaks(caplog, monkeypatch):
    key = "sk-test-" + secrets.token_hex(16)
    monkeypatch.setenv("DS_TEST_API_KEY", key)
    caplog.set_level(logging.DEBUG)  # includes httpx/httpcore request and header traces
    texts: list[str] = []
    records: list[dict] = []
    with FaultProxy(retry_after="0", echo_auth=True, slow_s=3.0) as proxy:
        proxy.script("ok", "500", "429", "reset", "slow", "garbage")
        proxy.script("rejected", "400")
        proxy.script("exhausted", *["500"] * 5)
        for texts_in, retries in ((["ok"], 6), (["rejected"], 6), (["exhausted"], 1)):
            cfg = openai_cfg(proxy.url, api_key_env="DS_TEST_API_KEY", max_retries=retries, timeout_s=1.0)
            backend = OpenAIBackend("ds", cfg, GENERATION, "m")
            try:
                backend.generate(prompts(*texts_in), records.append, Usage())
            except GenerationError as err:
                texts += [str(err), repr(err), "".join(traceback.format_exception(err))]
    assert len(records) == 1 and len(texts) == 6
    assert all(h.get("Authorization") == f"Bearer {key}" for h in proxy.headers)
    assert "X-Echo-Authorization" in caplog.text  # httpcore logged the echoing headers...
    assert "[REDACTED]" in caplog.text  # ...and the echoed key was there to redact
    everything = [caplog.text, *(r.getMessage() for r in caplog.records), *texts, json.dumps(records)]
    assert not [t for t in everything if key in t]


# ----- tools -----

WEATHER = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}


def test_tools_and_earlier_calls_reach_the_server_and_calls_come_back_structured():
    earlier = {"type": "function", "function": {"name": "weather", "arguments": {"city": "Oslo"}}, "id": "c1"}
    messages = [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": "", "tool_calls": [earlier]},
        {"role": "tool", "content": "-3 C", "tool_call_id": "c1"},
        {"role": "user", "content": "call: weather Bergen"},
    ]
    with FaultProxy() as proxy:
        [record] = run(proxy, [Prompt("ds-0", 0, 1, messages, [WEATHER])])
        [body] = proxy.bodies
    assert body["tools"] == [WEATHER]
    # The API takes arguments as a JSON string; the dataset's decoded form is left as it was.
    assert body["messages"][1]["tool_calls"][0]["function"]["arguments"] == '{"city": "Oslo"}'
    assert messages[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Oslo"}
    assert record["tool_calls"] == [
        {"type": "function", "function": {"name": "weather", "arguments": {"city": "Bergen"}}, "id": "call_0"}
    ]
    assert (record["response"], record["tools"], record["finish_reason"]) == ("", [WEATHER], "tool_calls")


def test_a_prompt_without_tools_sends_none():
    with FaultProxy() as proxy:
        [record] = run(proxy, prompts("call: weather Bergen"))
        [body] = proxy.bodies
    assert "tools" not in body and "tool_calls" not in record and "tools" not in record


# ----- a real server (slow) -----

SERVE_PROMPTS = ("What is 2+2?", "Name a colour.", "Say hello.")


def _check_real(records: list[dict]) -> None:
    assert sorted(r["id"] for r in records) == ["ds-0", "ds-1", "ds-2"]
    for record in records:
        assert record["response"].strip()
        assert record["finish_reason"] in ("stop", "length")
        assert record["usage"]["prompt_tokens"] > 0
        assert 0 < record["usage"]["completion_tokens"] <= GENERATION.max_new_tokens


@pytest.mark.slow
def test_real_server_renders_the_tools_and_earlier_calls(tools_model_dir):
    """`transformers serve` renders the request's tools and structured calls with the model's
    template: its prompt count is what the same template gives in process."""
    from transformers_serve import start_transformers_serve

    from draftsmith.runtime.process import free_port
    from draftsmith.target.load import load_tokenizer, prompt_ids

    earlier = {"type": "function", "function": {"name": "weather", "arguments": {"city": "Oslo"}}, "id": "c1"}
    messages = [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": "", "tool_calls": [earlier]},
        {"role": "tool", "content": "-3 C", "tool_call_id": "c1"},
    ]
    records: list[dict] = []
    with start_transformers_serve(tools_model_dir, free_port()) as url:
        backend = OpenAIBackend("ds", openai_cfg(url, timeout_s=300), GENERATION, str(tools_model_dir))
        backend.generate([Prompt("ds-0", 0, 1, messages, [WEATHER])], records.append, Usage())
    [record] = records
    tokenizer = load_tokenizer(tools_model_dir)
    assert record["usage"]["prompt_tokens"] == len(prompt_ids(tokenizer, messages, [WEATHER]))
    assert record["tools"] == [WEATHER] and record["finish_reason"] in ("stop", "length")


@pytest.mark.slow
def test_real_server(transformers_server):
    url, model = transformers_server
    records: list[dict] = []
    OpenAIBackend("ds", openai_cfg(url, timeout_s=120), GENERATION, model).generate(
        prompts(*SERVE_PROMPTS), records.append, Usage()
    )
    _check_real(records)


@pytest.mark.slow
def test_real_server_through_faults(transformers_server):
    url, model = transformers_server
    records: list[dict] = []
    with FaultProxy(url) as proxy:
        proxy.script(SERVE_PROMPTS[0], "500", "reset")
        cfg = openai_cfg(proxy.url, timeout_s=120, concurrency=2)
        OpenAIBackend("ds", cfg, GENERATION, model).generate(prompts(*SERVE_PROMPTS), records.append, Usage())
    _check_real(records)
    assert proxy.counts == {SERVE_PROMPTS[0]: 3, SERVE_PROMPTS[1]: 1, SERVE_PROMPTS[2]: 1}


@pytest.mark.slow
def test_real_server_rejects_token_id_fields(transformers_server):
    # Why request_token_ids defaults to off: transformers serve validates fields.
    url, model = transformers_server
    backend = OpenAIBackend("ds", openai_cfg(url, request_token_ids=True), GENERATION, model)
    with pytest.raises(GenerationError, match="HTTP 422.*return_token_ids"):
        backend.generate(prompts("hi"), lambda record: None, Usage())
