"""A fault-injecting HTTP proxy for OpenAI-compatible chat servers (tests only).

Forwards POSTs to an upstream base URL, or (with no upstream) answers itself
with small canned chat completions. Faults are scripted per prompt (the last
user message): `proxy.script("hello", "500", "reset")` makes the first request
for "hello" get a 500, the second a connection reset, the third pass through.
The key "*" scripts every prompt that has no script of its own.

Fault kinds: "429" (with `retry_after`), "500", "400", "reset" (RST, no reply),
"slow" (reply after `slow_s`), "garbage" (200, not JSON), "no_choices" (200,
JSON without choices). With `echo_auth`, error bodies and headers repeat the
Authorization header, as a careless server might.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

FAULTS = frozenset({"429", "500", "400", "reset", "slow", "garbage", "no_choices"})
MAX_BODY_BYTES = 1 << 20
UPSTREAM_TIMEOUT_S = 120


class FaultProxy:
    def __init__(
        self,
        upstream: str | None = None,
        *,
        retry_after: str = "1",
        slow_s: float = 2.0,
        latency_s: float = 0.0,
        echo_auth: bool = False,
        max_requests: int = 500,
    ) -> None:
        self.upstream = upstream.rstrip("/") if upstream else None
        self.retry_after = retry_after
        self.slow_s = slow_s
        self.latency_s = latency_s  # canned-mode think time, to overlap requests
        self.echo_auth = echo_auth
        self.max_requests = max_requests
        self.scripts: dict[str, list[str | None]] = {}
        self.counts: dict[str, int] = {}
        self.delivered: dict[str, int] = {}  # pass-through answers the client received, per prompt
        self.headers: list[dict[str, str]] = []
        self.bodies: list[Any] = []
        self.times: dict[str, list[float]] = {}  # monotonic arrival times per prompt
        self.in_flight = 0
        self.max_in_flight = 0
        self.total = 0
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._server.daemon_threads = True
        # A short poll interval keeps shutdown() (once per test) fast.
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def script(self, prompt: str, *faults: str | None) -> None:
        """Faults for the 1st, 2nd, ... request of `prompt` (None: pass through)."""
        unknown = set(faults) - FAULTS - {None}
        if unknown:
            raise ValueError(f"unknown fault(s) {sorted(unknown)}; known: {sorted(FAULTS)}")
        self.scripts[prompt] = list(faults)

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._closing.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    # ----- bookkeeping (handler threads) -----

    def _arrive(self, body: Any, headers: dict[str, str]) -> tuple[int, str | None]:
        prompt = last_user_message(body)
        with self._lock:
            self.total += 1
            self.headers.append(headers)
            self.bodies.append(body)
            self.times.setdefault(prompt, []).append(time.monotonic())
            n = self.counts[prompt] = self.counts.get(prompt, 0) + 1
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            script = self.scripts.get(prompt, self.scripts.get("*", []))
            return self.total, script[n - 1] if n <= len(script) else None

    def _delivered(self, body: Any) -> None:
        prompt = last_user_message(body)
        with self._lock:
            self.delivered[prompt] = self.delivered.get(prompt, 0) + 1

    def _leave(self) -> None:
        with self._lock:
            self.in_flight -= 1


def last_user_message(body: Any) -> str:
    messages = body.get("messages") if isinstance(body, dict) else None
    users = [m.get("content", "") for m in messages or [] if isinstance(m, dict) and m.get("role") == "user"]
    return str(users[-1]) if users else ""


def canned_completion(body: dict) -> dict:
    """A deterministic answer: the prompt's words reversed, cut at max_tokens words.

    Token counts are word counts; ids (when asked for) are the words' lengths.
    """
    prompt = last_user_message(body)
    words = ["echo:", *reversed(prompt.split())]
    limit = int(body.get("max_tokens") or len(words))
    out = words[:limit]
    n_prompt = sum(len(str(m.get("content", "")).split()) for m in body.get("messages", []))
    choice: dict[str, Any] = {
        "index": 0,
        "message": {"role": "assistant", "content": " ".join(out)},
        "finish_reason": "length" if len(out) < len(words) else "stop",
    }
    if prompt.startswith("think:"):
        choice["message"]["reasoning_content"] = f"thinking about {len(prompt)} characters"
    if prompt.startswith("call:") and body.get("tools"):  # "call: <function> <city>"
        name, city = prompt.split()[1:3]
        arguments = json.dumps({"city": city})
        call = {"id": "call_0", "type": "function", "function": {"name": name, "arguments": arguments}}
        choice.update(
            message={"role": "assistant", "content": None, "tool_calls": [call]}, finish_reason="tool_calls"
        )
    if body.get("return_token_ids"):
        choice["token_ids"] = [len(w) for w in out]
    return {
        "id": "canned",
        "object": "chat.completion",
        "model": body.get("model"),
        "choices": [choice],
        "usage": {
            "prompt_tokens": n_prompt,
            "completion_tokens": len(out),
            "total_tokens": n_prompt + len(out),
        },
    }


def _handler_for(proxy: FaultProxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as real servers do
        timeout = 30  # idle keep-alive connections give up eventually

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass  # quiet: the tests assert on captured logs

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY_BYTES:
                self._send(413, b'{"error": "body too large"}')
                return
            raw = self.rfile.read(length)
            try:
                body = json.loads(raw)
            except ValueError:
                body = {}
            number, fault = proxy._arrive(body, dict(self.headers))
            try:
                if number > proxy.max_requests:
                    self._send(503, b'{"error": "fault proxy: request limit reached"}')
                else:
                    self._serve(fault, raw, body)
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True  # the client gave up (e.g. its timeout)
            finally:
                proxy._leave()

        def _serve(self, fault: str | None, raw: bytes, body: dict) -> None:
            if fault == "reset":
                self._reset()
            elif fault in ("429", "500", "400"):
                self._error(int(fault))
            elif fault == "garbage":
                self._send(200, b"<html>upstream exploded</html>", "text/html")
            elif fault == "no_choices":
                self._send(200, b'{"object": "chat.completion", "choices": []}')
            else:
                if fault == "slow" and proxy._closing.wait(proxy.slow_s):
                    return
                self._answer(raw, body)

        def _answer(self, raw: bytes, body: dict) -> None:
            if proxy.upstream is None:
                if proxy.latency_s:
                    proxy._closing.wait(proxy.latency_s)
                self._send(200, json.dumps(canned_completion(body)).encode())
                return
            request = urllib.request.Request(
                proxy.upstream + self.path.removeprefix("/v1"),
                data=raw,
                method="POST",
                headers={
                    k: v for k, v in self.headers.items() if k.lower() in ("content-type", "authorization")
                },
            )
            try:
                with urllib.request.urlopen(request, timeout=UPSTREAM_TIMEOUT_S) as reply:
                    self._send(reply.status, reply.read(), reply.headers.get_content_type())
                    proxy._delivered(body)
            except urllib.error.HTTPError as err:
                self._send(err.code, err.read(), err.headers.get_content_type())

        def _error(self, status: int) -> None:
            auth = self.headers.get("Authorization", "")
            detail = {"error": {"code": status, "message": f"injected {status}"}}
            extra = {}
            if proxy.echo_auth:
                detail["error"]["request_headers"] = {"Authorization": auth}
                extra["X-Echo-Authorization"] = auth
            if status == 429:
                extra["Retry-After"] = proxy.retry_after
            self._send(status, json.dumps(detail).encode(), headers=extra)

        def _reset(self) -> None:
            # SO_LINGER with a zero timeout makes close() send RST, not FIN.
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()
            self.close_connection = True

        def _send(
            self,
            status: int,
            payload: bytes,
            content_type: str = "application/json",
            headers: dict[str, str] | None = None,
        ) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(payload)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(payload)

    return Handler
