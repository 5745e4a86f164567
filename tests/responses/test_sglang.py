"""The SGLang generation backend: its launch command, and the server's lifetime."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import httpx
import pytest
from conftest import openai_cfg, sglang_block, sglang_server_args

from draftsmith.errors import DraftsmithError, GenerationError
from draftsmith.formats.responses import Usage
from draftsmith.responses.settings import SGLANG_SECTION, Sampling
from draftsmith.responses.sglang import SGLangBackend
from draftsmith.runtime.process import free_port
from draftsmith.runtime.sglang import ServerLaunch, SGLangConfigError

MODEL = "/models/target"


def _cfg(**overrides) -> dict:
    """generation.sglang with the schema's defaults."""
    return sglang_block("generation", **overrides)


def _server(**overrides) -> ServerLaunch:
    """generation.sglang's settings, as `workflow.configure` builds them (extra args refused)."""
    return ServerLaunch.of(_cfg(**overrides), SGLANG_SECTION)


SAMPLING = Sampling(max_new_tokens=8, temperature=0.0, top_p=1.0, seed=0)


def test_minimal_command():
    assert _server().command(MODEL) == [
        "python3", "-m", "sglang.launch_server", "--model-path", MODEL,
        "--host", "127.0.0.1", "--port", "30000", "--tp-size", "1",
    ]  # fmt: skip


def test_optional_flags_then_extra_args_in_order():
    server = _server(
        python="/opt/venv/bin/python",
        host="0.0.0.0",
        port=31000,
        tp_size=8,
        mem_fraction_static=0.85,
        context_length=8192,
        extra_args=["--disable-radix-cache", "--chunked-prefill-size", "-1", "--dtype=bfloat16"],
    )
    assert server.command(MODEL) == [
        "/opt/venv/bin/python", "-m", "sglang.launch_server", "--model-path", MODEL,
        "--host", "0.0.0.0", "--port", "31000", "--tp-size", "8",
        "--mem-fraction-static", "0.85", "--context-length", "8192",
        "--disable-radix-cache", "--chunked-prefill-size", "-1", "--dtype=bfloat16",
    ]  # fmt: skip


def test_sglang_parses_the_command():
    """SGLang's own parser reads the generation server's command as built, extra args included."""
    extra = ["--disable-radix-cache", "--chunked-prefill-size", "-1", "--dtype=bfloat16"]
    server = _server(port=31000, tp_size=2, mem_fraction_static=0.85, context_length=8192, extra_args=extra)
    args = sglang_server_args().prepare_server_args(server.command(MODEL)[3:])
    assert (args.model_path, args.host, args.port, args.tp_size) == (MODEL, "127.0.0.1", 31000, 2)
    assert (args.mem_fraction_static, args.context_length, args.dtype) == (0.85, 8192, "bfloat16")
    assert args.disable_radix_cache and args.chunked_prefill_size == -1


@pytest.mark.parametrize(
    ("extra", "hint"),
    [
        (["--port", "1234"], "generation.sglang.port"),
        (["--port=1234"], "generation.sglang.port"),
        (["--host", "::"], "generation.sglang.host"),
        (["--model", "/other"], "the target model"),
        (["--model-path=/other"], "the target model"),
        (["--tensor-parallel-size", "2"], "generation.sglang.tp_size"),
        (["--tp", "2"], "generation.sglang.tp_size"),  # argparse prefix of --tp-size
        (["--tp-size=2"], "generation.sglang.tp_size"),
        (["--context-length", "4096"], "generation.sglang.context_length"),
        (["--mem-fraction-static=0.5"], "generation.sglang.mem_fraction_static"),
    ],
)
def test_rejects_extra_args_that_duplicate_builder_flags(extra, hint):
    with pytest.raises(SGLangConfigError, match="duplicates") as err:
        _server(extra_args=["--disable-cuda-graph", *extra])
    assert hint in str(err.value)
    assert isinstance(err.value, ValueError) and isinstance(err.value, DraftsmithError)


@pytest.mark.parametrize(
    "extra",
    [
        ["--speculative-algorithm", "EAGLE3"],
        ["--speculative-draft-model-path=/drafts/d1"],
        ["--speculative-num-steps", "3"],
    ],
)
def test_rejects_speculative_flags(extra):
    with pytest.raises(SGLangConfigError, match="plain target"):
        _server(extra_args=extra)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--config", "x.yaml"], "--config is refused: it reads a config file"),
        (["--conf=x.yaml"], "--conf is refused: it reads a config file"),  # argparse prefix of --config
        (["--api-key", "s3cret"], "--api-key is refused: it puts a secret in the config"),
        (["--load-format", "dummy"], "--load-format dummy loads random weights"),
    ],
)
def test_rejects_what_every_launch_refuses(extra, message):
    """A config file could switch speculation on unseen: generation refuses it as capture and
    serving do."""
    with pytest.raises(SGLangConfigError, match=f"generation.sglang.extra_args: {message}"):
        _server(extra_args=extra)


def test_server_url_reaches_wildcard_hosts_over_loopback():
    assert _server(host="0.0.0.0", port=5).url == "http://127.0.0.1:5"
    assert _server(host="::1", port=5).url == "http://[::1]:5"
    assert _server(host="10.0.0.2", port=5).url == "http://10.0.0.2:5"


# Limits: SGLang needs a GPU, so a small stand-in takes the place of
# `python -m sglang.launch_server` (it is given as generation.sglang.python): it
# records its arguments, forks one worker and serves /health. This checks the
# supervision path only (start, health wait, delegation, teardown), not that
# SGLang accepts the command or generates anything.
FAKE_SGLANG = """#!{python}
import http.server, json, os, sys, time
from pathlib import Path

here = Path(__file__).parent
worker = os.fork()
if worker == 0:
    time.sleep(600)
    os._exit(0)
(here / "argv.json").write_text(json.dumps(sys.argv[1:]))
with (here / "starts.log").open("a") as starts:
    starts.write("start;")
print("fake sglang: ready", flush=True)


class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()


port = int(sys.argv[sys.argv.index("--port") + 1])
http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
"""


def running_with(marker: str) -> list[int]:
    """Pids of live (non-zombie) processes whose command line mentions `marker`."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().decode(errors="replace")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if marker in cmdline and state != "Z":
            pids.append(int(proc.name))
    return pids


@pytest.mark.parametrize("fails", [True, False], ids=["generation-fails", "generation-succeeds"])
def test_backend_runs_generation_inside_the_server_and_tears_it_down(tmp_path, monkeypatch, fails):
    fake = tmp_path / "fake-python"
    fake.write_text(FAKE_SGLANG.format(python=sys.executable))
    fake.chmod(0o755)
    port = free_port()
    seen: dict = {}

    class StubOpenAIBackend:  # the delegate's own behaviour is tested elsewhere
        def __init__(self, dataset, openai, sampling, served_model):
            seen.update(dataset=dataset, cfg=openai, sampling=sampling, model=served_model)

        def generate(self, prompts, emit, spent):
            url = seen["cfg"].base_url.removesuffix("/v1") + "/health"
            seen["health"] = httpx.get(url, trust_env=False).status_code
            seen["running"] = running_with(str(fake))
            if fails:
                raise GenerationError("upstream failed")
            emit({"id": prompts[0]})

    stub = types.ModuleType("draftsmith.responses.openai_api")
    stub.OpenAIBackend = StubOpenAIBackend
    monkeypatch.setitem(sys.modules, "draftsmith.responses.openai_api", stub)

    server = _server(python=str(fake), port=port, startup_timeout_s=30)
    paid = openai_cfg("https://paid.example/v1", model="paid", api_key_env="KEY")
    log_path = tmp_path / "logs" / "sglang.log"
    backend = SGLangBackend("ds", MODEL, server, paid, SAMPLING, log_path)
    emitted: list[dict] = []
    if fails:
        with pytest.raises(GenerationError, match="upstream failed"):
            backend.generate(["p0"], emitted.append, Usage())
    else:
        backend.generate(["p0"], emitted.append, Usage())
        assert emitted == [{"id": "p0"}]

    assert seen["health"] == 200
    assert len(seen["running"]) == 3  # guard, server, worker
    assert running_with(str(fake)) == []
    assert seen["model"] == MODEL and seen["dataset"] == "ds"
    assert (seen["cfg"].base_url, seen["cfg"].model, seen["cfg"].api_key_env) == (
        f"http://127.0.0.1:{port}/v1",
        None,
        None,
    )
    assert seen["cfg"].concurrency == paid.concurrency and seen["sampling"] == SAMPLING
    argv = json.loads((tmp_path / "argv.json").read_text())
    assert argv[:4] == ["-m", "sglang.launch_server", "--model-path", MODEL]
    assert "fake sglang: ready" in log_path.read_text()


def test_a_held_backend_keeps_one_server_for_every_round(tmp_path, monkeypatch):
    """`every_turn` asks in rounds: the job holds the backend, so SGLang starts once."""
    fake = tmp_path / "fake-python"
    fake.write_text(FAKE_SGLANG.format(python=sys.executable))
    fake.chmod(0o755)

    class StubOpenAIBackend:  # the delegate's own behaviour is tested elsewhere
        def __init__(self, dataset, openai, sampling, served_model):
            pass

        def generate(self, prompts, emit, spent):
            emit({"id": prompts[0], "running": len(running_with(str(fake)))})

    stub = types.ModuleType("draftsmith.responses.openai_api")
    stub.OpenAIBackend = StubOpenAIBackend
    monkeypatch.setitem(sys.modules, "draftsmith.responses.openai_api", stub)
    server = _server(python=str(fake), port=free_port(), startup_timeout_s=30)
    backend = SGLangBackend(
        "ds", MODEL, server, openai_cfg("http://unused"), SAMPLING, tmp_path / "sglang.log"
    )
    emitted: list[dict] = []
    with backend:
        for prompt in ("p0", "p1", "p2"):
            backend.generate([prompt], emitted.append, Usage())
    assert emitted == [{"id": p, "running": 3} for p in ("p0", "p1", "p2")]
    assert (tmp_path / "starts.log").read_text() == "start;"
    assert running_with(str(fake)) == []
