"""Generation with a local SGLang server that this job starts and stops.

The server runs the plain target (no speculative decoding: the responses must
be the target's own). Requests go through the OpenAI-compatible backend, pointed
at the server; the server's whole process tree is torn down when generation
ends, fails or is interrupted (see `draftsmith.runtime.process`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from draftsmith.runtime.process import ManagedServer

if TYPE_CHECKING:
    from draftsmith.formats.datasets.rows import Prompt
    from draftsmith.formats.responses import Usage
    from draftsmith.responses.settings import OpenAIGeneration, Sampling
    from draftsmith.runtime.sglang import ServerLaunch


class SGLangBackend:
    def __init__(
        self,
        dataset: str,
        model_dir: str,
        server: ServerLaunch,
        openai: OpenAIGeneration,
        sampling: Sampling,
        log_path: Path | None,
    ) -> None:
        self.dataset = dataset
        self.model_dir = model_dir
        self.server = server
        self.sampling = sampling
        self.log_path = log_path
        self.cmd = server.command(model_dir)  # the plain target: `of` refused speculative flags
        self.url = server.url
        # Our own server serves model_dir and needs no key: never send it a paid-API key.
        self.openai = replace(openai, base_url=f"{self.url}/v1", model=None, api_key_env=None)
        self._server: ManagedServer | None = None

    def __enter__(self) -> SGLangBackend:
        """Keep one server for every `generate` until exit (the rounds of `every_turn`)."""
        self._server = ManagedServer(
            self.cmd,
            health_url=f"{self.url}/health",
            log_path=self.log_path,
            startup_timeout_s=self.server.startup_timeout_s,
            name=f"sglang server for {self.dataset}",
        )
        self._server.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        server, self._server = self._server, None
        server.__exit__(*exc)

    def generate(self, prompts: list[Prompt], emit: Callable[[dict], None], spent: Usage) -> None:
        """Inside the server this backend holds, else inside one started for this call."""
        if self._server is None:
            with self:
                return self.generate(prompts, emit, spent)
        # Imported here: the OpenAI backend (and its client) is only needed now.
        from draftsmith.responses.openai_api import OpenAIBackend

        backend = OpenAIBackend(self.dataset, self.openai, self.sampling, served_model=self.model_dir)
        backend.generate(prompts, emit, spent)
