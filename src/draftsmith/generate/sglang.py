"""Generation with a local SGLang server that this job starts and stops.

The server runs the plain target (no speculative decoding: the responses must
be the target's own). Requests go through the OpenAI-compatible backend, pointed
at the server; the server's whole process tree is torn down when generation
ends, fails or is interrupted (see `draftsmith.process`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from draftsmith.errors import DraftsmithError
from draftsmith.process import ManagedServer
from draftsmith.sglang_args import abbreviates, flag_names

if TYPE_CHECKING:
    from draftsmith.datasets import Prompt
    from draftsmith.generate.records import Usage

_SECTION = "generation.sglang"
# Flags the base command sets, with their SGLang aliases, mapped to the key (in the
# config section that holds the sglang settings) to use instead.
_OWNED_KEYS = {
    "--host": "host",
    "--port": "port",
    "--tp-size": "tp_size",
    "--tensor-parallel-size": "tp_size",
    "--mem-fraction-static": "mem_fraction_static",
    "--context-length": "context_length",
}
_MODEL_FLAGS = ("--model-path", "--model")
_WILDCARD_HOSTS = ("", "0.0.0.0", "::")


class SGLangConfigError(DraftsmithError, ValueError):
    """generation.sglang asks for a launch the builder cannot make."""


def build_launch_command(model_dir: str, sglang_cfg: dict) -> list[str]:
    """The `sglang.launch_server` command line for generation with the plain target."""
    extra = [str(arg) for arg in sglang_cfg.get("extra_args") or []]
    _check_extra_args(extra)
    return base_launch_command(model_dir, sglang_cfg) + extra


def base_launch_command(model_dir: str, sglang_cfg: dict) -> list[str]:
    """Model, address, parallelism and memory flags from an sglang config block; no extra args."""
    cmd = [sglang_cfg["python"], "-m", "sglang.launch_server", "--model-path", model_dir]
    cmd += ["--host", sglang_cfg["host"], "--port", str(sglang_cfg["port"])]
    cmd += ["--tp-size", str(sglang_cfg["tp_size"])]
    if sglang_cfg.get("mem_fraction_static") is not None:
        cmd += ["--mem-fraction-static", str(sglang_cfg["mem_fraction_static"])]
    if sglang_cfg.get("context_length") is not None:
        cmd += ["--context-length", str(sglang_cfg["context_length"])]
    return cmd


def owned_flags(section: str) -> dict[str, str]:
    """Flags `base_launch_command` sets, mapped to what to configure in `section` instead."""
    owned = dict.fromkeys(_MODEL_FLAGS, "the target model")
    return owned | {flag: f"{section}.{key}" for flag, key in _OWNED_KEYS.items()}


def check_owned_flags(extra: list[str], owned: dict[str, str], section: str) -> None:
    """Refuse extra args that repeat a flag the builder sets, in any spelling SGLang accepts."""
    for flag in flag_names(extra):
        # `--tp` means `--tp-size`; a prefix of several is refused too (SGLang finds it ambiguous).
        matches = [known for known in owned if abbreviates(flag, known)]
        if matches:
            raise SGLangConfigError(
                f"{section}.extra_args: {flag} duplicates {matches[0]}, which draftsmith "
                f"sets itself; use {owned[matches[0]]} instead"
            )


def _check_extra_args(extra: list[str]) -> None:
    for flag in flag_names(extra):
        if flag.startswith("--speculative"):
            raise SGLangConfigError(
                f"{_SECTION}.extra_args: {flag} is not allowed: generation must run "
                "the plain target (speculative decoding belongs to the benchmark stage)"
            )
    check_owned_flags(extra, owned_flags(_SECTION), _SECTION)


def server_url(sglang_cfg: dict) -> str:
    """Base URL to reach the server from this machine."""
    host = sglang_cfg["host"]
    host = "127.0.0.1" if host in _WILDCARD_HOSTS else host
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{sglang_cfg['port']}"


class SGLangBackend:
    def __init__(
        self,
        dataset: str,
        model_dir: str,
        sglang_cfg: dict,
        openai_cfg: dict,
        generation: dict,
        log_path: Path | None,
    ) -> None:
        self.dataset = dataset
        self.model_dir = model_dir
        self.sglang_cfg = sglang_cfg
        self.generation = generation
        self.log_path = log_path
        self.cmd = build_launch_command(model_dir, sglang_cfg)  # fail before any work
        # Our own server serves model_dir and needs no key: never send it a paid-API key.
        url = f"{server_url(sglang_cfg)}/v1"
        self.openai_cfg = {**openai_cfg, "base_url": url, "model": None, "api_key_env": None}

    def generate(self, prompts: list[Prompt], emit: Callable[[dict], None], spent: Usage) -> None:
        server = ManagedServer(
            self.cmd,
            health_url=f"{server_url(self.sglang_cfg)}/health",
            log_path=self.log_path,
            startup_timeout_s=self.sglang_cfg["startup_timeout_s"],
            name=f"sglang server for {self.dataset}",
        )
        with server:
            # Imported here: the OpenAI backend (and its client) is only needed now.
            from draftsmith.generate.openai_api import OpenAIBackend

            backend = OpenAIBackend(
                self.dataset, self.openai_cfg, self.generation, served_model=self.model_dir
            )
            backend.generate(prompts, emit, spent)
