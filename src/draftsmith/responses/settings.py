"""The settings the responses stage reads, per dataset, resolved once by `workflow.configure`:
the dataset's entry (with `dataset_defaults`) and its generation settings (the dataset's
overrides over `generation`), and the chosen backend's section.

No torch here: the Snakefile builds these while parsing.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from types import MappingProxyType

from draftsmith import config as cfg
from draftsmith.formats.responses import Usage
from draftsmith.runtime.resources import responses_gpus
from draftsmith.runtime.sglang import ServerLaunch

SGLANG_SECTION = "generation.sglang"


@dataclass(frozen=True)
class DatasetSource:
    """What `formats.datasets.load.load_prompts` reads of a dataset's entry."""

    path: str
    format: str
    prompt_field: str
    roles: tuple[tuple[str, str], ...]  # source role name -> chat role, in config order
    regenerate: str  # last or every_turn
    split: str | None
    max_samples: int | None
    max_prompt_tokens: int
    max_bad_fraction: float
    system_prompt: str | None  # the dataset's generation.system_prompt, else generation's

    def entry(self) -> dict:
        """The config-shaped entry `load_prompts` reads (shared with the prompt sets' loader)."""
        entry = {k: v for k, v in asdict(self).items() if k != "system_prompt"}
        return entry | {"roles": dict(self.roles), "generation": {"system_prompt": self.system_prompt}}


@dataclass(frozen=True)
class Sampling:
    """How the target writes each answer: the dataset's generation settings over generation's."""

    max_new_tokens: int
    temperature: float
    top_p: float
    seed: int


@dataclass(frozen=True)
class HFGeneration:
    """`generation.hf`: in-process generation with transformers."""

    device: str
    batch_size: int
    attention: str  # one of `responses.hf.ATTENTION`
    dtype: str  # generation.hf.dtype, else model.dtype


@dataclass(frozen=True)
class OpenAIGeneration:
    """`generation.openai`: requests to an OpenAI-compatible server (a launched SGLang server's
    too), and the prices every backend's spend is costed at."""

    base_url: str
    model: str | None  # the served model's name; None: the model path
    api_key_env: str | None  # the variable holding the key, read in the job only
    concurrency: int
    timeout_s: float
    max_retries: int
    backoff_s: float
    max_backoff_s: float
    request_token_ids: bool
    extra_body: str  # as JSON text, so that it stays frozen; `extra_fields` reads it
    price_per_million_input: float
    price_per_million_output: float
    budget_usd: float | None

    @classmethod
    def of(cls, section: dict) -> OpenAIGeneration:
        fields = {k: v for k, v in section.items() if k != "extra_body"}
        return cls(**fields, extra_body=json.dumps(section["extra_body"]))

    def extra_fields(self) -> dict:
        """The fields every request body gets beyond draftsmith's own."""
        return json.loads(self.extra_body)

    def cost_usd(self, usage: Usage) -> float:
        return (
            usage.prompt_tokens * self.price_per_million_input
            + usage.completion_tokens * self.price_per_million_output
        ) / 1e6


@dataclass(frozen=True)
class ResponsesSettings:
    """What one dataset's responses job reads."""

    source: DatasetSource
    backend: str  # hf, openai or sglang
    sampling: Sampling
    openai: OpenAIGeneration
    hf: HFGeneration | None  # the hf backend's; None for the others
    sglang: ServerLaunch | None  # the sglang backend's local server; None for the others
    trust_remote_code: bool  # model.trust_remote_code, for the tokenizer that counts prompt tokens
    gpus: int  # GPUs the job holds (`runtime.resources.responses_gpus`)

    @classmethod
    def of(cls, config: dict, dataset: str) -> ResponsesSettings:
        entry = cfg.dataset_settings(config, dataset)
        generation, section = entry["generation"], config["generation"]
        backend = generation["backend"]
        hf = section["hf"]
        return cls(
            source=DatasetSource(
                path=entry["path"],
                format=entry["format"],
                prompt_field=entry["prompt_field"],
                roles=tuple(entry["roles"].items()),
                regenerate=entry["regenerate"],
                split=entry["split"],
                max_samples=entry["max_samples"],
                max_prompt_tokens=entry["max_prompt_tokens"],
                max_bad_fraction=entry["max_bad_fraction"],
                system_prompt=generation["system_prompt"],
            ),
            backend=backend,
            sampling=Sampling(
                max_new_tokens=generation["max_new_tokens"],
                temperature=generation["temperature"],
                top_p=generation["top_p"],
                seed=generation["seed"],
            ),
            openai=OpenAIGeneration.of(section["openai"]),
            hf=(
                HFGeneration(hf["device"], hf["batch_size"], hf["attention"], cfg.generation_dtype(config))
                if backend == "hf"
                else None
            ),
            sglang=ServerLaunch.of(section["sglang"], SGLANG_SECTION) if backend == "sglang" else None,
            trust_remote_code=config["model"]["trust_remote_code"],
            gpus=responses_gpus(config, backend),
        )

    @classmethod
    def per_dataset(cls, config: dict) -> Mapping[str, ResponsesSettings]:
        """Each generated (enabled) dataset's settings, by name; read-only."""
        return MappingProxyType({name: cls.of(config, name) for name in cfg.enabled_datasets(config)})
