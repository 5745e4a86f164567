"""Stage keys and artifact paths: the one place that says where each artifact lives.

Every stage's outputs sit under `<artifacts>/<stage>/.../<key>/`, where the key
hashes the stage's semantic parameters, its format version and its upstream
keys (see `hashing.derive_key`). Two configs that agree on a stage's inputs and
parameters get the same key and share the files; differing outputs sit side by
side. Performance settings (batch size, concurrency, timeouts, prices) are not
semantic and are left out on purpose.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from draftsmith import config as cfg
from draftsmith.hashing import HashCache, derive_key

# Bump a stage's version when its output format or semantics change on purpose:
# that stage and everything downstream rebuild, nothing upstream does.
STAGE_VERSIONS = {
    "model": 1,
    "responses": 1,
    "tokens": 1,
    "merged": 1,
    "hidden": 1,
    "draft_vocab": 1,
    "draft": 2,
    "export": 1,
    "eval": 2,
    "serve_bench": 1,
}

# Serving-benchmark settings that do not change what is measured (where, how patiently).
_SERVE_BENCH_IGNORED = ("python", "port", "startup_timeout_s", "request_timeout_s")

# Generation settings that change what the target writes (the rest is speed).
SEMANTIC_GENERATION = ("backend", "max_new_tokens", "temperature", "top_p", "seed", "system_prompt")

# Training settings that change the trained draft. `device` and `gpus` do not: data
# parallel gives the result of one process with the same global batch.
SEMANTIC_TRAIN = (
    "draft_vocab_size",
    "ttt_steps",
    "max_position_embeddings",
    "lr",
    "betas",
    "weight_decay",
    "warmup_steps",
    "total_steps",
    "grad_clip",
    "grad_accum",
    "batch_tokens",
    "checkpoint_every",
    "val_fraction",
    "seed",
    "dtype",
)

HF_METADATA_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "special_tokens_map.json",
    "model.safetensors.index.json",
)


def stage_key(stage: str, params: dict, upstream: dict[str, str] | None = None) -> str:
    return derive_key(
        {
            "stage": stage,
            "version": STAGE_VERSIONS[stage],
            "params": params,
            "upstream": upstream or {},
        }
    )


@dataclass
class Plan:
    """Keys and paths of every artifact a config asks for, computed at parse time."""

    config: dict
    hash_cache: HashCache
    missing_sources: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.root = Path(self.config["artifacts_dir"])
        self.model_key = stage_key("model", self._model_params())
        self.response_keys = {n: self._response_key(n) for n in self.generated_datasets}
        self.token_keys = {n: self._token_key(n) for n in self.generated_datasets}
        self.merged_key = stage_key(
            "merged",
            {"seed": self.config["merge"]["seed"], "caps": self.merge_caps()},
            {f"tokens/{n}": self.token_keys[n] for n in self.merged_datasets},
        )
        self.hidden_key = stage_key(
            "hidden", self._hidden_params(), {"model": self.model_key, "merged": self.merged_key}
        )
        train = self.config["train"]
        self.draft_vocab_key = stage_key(
            "draft_vocab",
            {"draft_vocab_size": train["draft_vocab_size"], "val_fraction": train["val_fraction"]},
            {"model": self.model_key, "merged": self.merged_key},
        )
        self.draft_key = stage_key(
            "draft",
            self.train_params(),
            {"model": self.model_key, "hidden": self.hidden_key, "draft_vocab": self.draft_vocab_key},
        )
        self.export_key = stage_key("export", self.export_params(), {"draft": self.draft_key})
        self.eval_key = stage_key(
            "eval",
            self._eval_params(),
            {"model": self.model_key, "export": self.export_key, "merged": self.merged_key},
        )
        self.serve_bench_key = stage_key(
            "serve_bench", self.serve_bench_params(), {"model": self.model_key, "export": self.export_key}
        )
        self.hash_cache.save()
        for path in self.missing_sources:
            print(
                f"draftsmith: source not found: {path} (planned with a placeholder key; "
                "the job that reads it fails until it exists)",
                file=sys.stderr,
            )

    @property
    def generated_datasets(self) -> list[str]:
        return cfg.enabled_datasets(self.config)

    @property
    def merged_datasets(self) -> list[str]:
        return cfg.enabled_datasets(self.config, merged_only=True)

    # --- content of sources -------------------------------------------------
    def _source_hash(self, path: str) -> str:
        p = Path(path)
        if not p.exists():
            self.missing_sources.append(path)
            return f"absent:{p.resolve()}"
        if p.is_dir():
            return self.hash_cache.tree_sha256(p)
        return self.hash_cache.sha256(p)

    def _model_params(self) -> dict:
        model = self.config["model"]
        source = dict(model["source"])
        if source["kind"] == "gguf" and "sha256" not in source:
            source["sha256"] = self._source_hash(source["path"])
        if source["kind"] == "hf_dir":
            source["metadata"] = self._hf_dir_fingerprint(Path(source["path"]))
        if source["kind"] == "gguf":
            del source["path"]  # the sha256 is the content; moving the file changes nothing
        elif source["kind"] == "hf_dir":
            source["path"] = str(Path(source["path"]).resolve())  # weights are stat'ed, not hashed
        return {
            "source": source,
            "dtype": model["dtype"],
            "end_of_turn_ids": model.get("end_of_turn_ids"),
        }

    def _hf_dir_fingerprint(self, root: Path) -> dict:
        # Hash the small metadata files; stat the weights (hashing a 600 GB target
        # on every dry run is not an option).
        if not root.is_dir():
            self.missing_sources.append(str(root))
            return {"absent": str(root.resolve())}
        metadata = {n: self.hash_cache.sha256(root / n) for n in HF_METADATA_FILES if (root / n).exists()}
        weights = {p.name: p.stat().st_size for p in sorted(root.glob("*.safetensors"))}
        return {"files": metadata, "weights": weights}

    def merge_caps(self) -> dict:
        return {n: c for n, c in sorted(self.config["merge"]["caps"].items()) if n in self.merged_datasets}

    def _hidden_params(self) -> dict:
        extract = self.config["extract"]
        return {
            "backend": extract["backend"],
            "num_shards": extract["num_shards"],
            "storage": extract["storage"],
            "dtype": extract["dtype"] or self.config["model"]["dtype"],
            "aux_layers": extract["aux_layers"] or "default",
        }

    def train_params(self) -> dict:
        train = self.config["train"]
        return {k: train[k] for k in SEMANTIC_TRAIN}

    def export_params(self) -> dict:
        return {**self.config["export"], "serving_context": cfg.export_serving_context(self.config)}

    def _eval_params(self) -> dict:
        evaluate = self.config["evaluate"]
        sets = {name: self._prompt_set_params(e) for name, e in sorted(evaluate["prompt_sets"].items())}
        # The results include tokens/s, so the device is part of the key (a CPU measurement
        # must not stand in for a GPU one); dtype can change the target's own greedy output.
        return {
            "k": evaluate["k"],
            "max_new_tokens": evaluate["max_new_tokens"],
            "device": evaluate["device"],
            "dtype": evaluate["dtype"],
            "warmup_prompts": evaluate["warmup_prompts"],
            "prompt_sets": sets,
        }

    def _prompt_set_params(self, entry: dict) -> dict:
        """A prompt set's settings, its file by content (not where it lies)."""
        return {"source": self._source_hash(entry["path"]), **{k: v for k, v in entry.items() if k != "path"}}

    def serve_bench_params(self) -> dict:
        # Speed is what a benchmark measures, so launch and load settings are part of its key.
        bench = {k: v for k, v in self.config["serve_benchmark"].items() if k != "enabled"}
        bench["sglang"] = {k: v for k, v in bench["sglang"].items() if k not in _SERVE_BENCH_IGNORED}
        entry = self.config["evaluate"]["prompt_sets"].get(bench["prompt_set"])
        if entry is not None:
            bench["prompts"] = self._prompt_set_params(entry)
            bench["system_prompt"] = self.config["generation"]["system_prompt"]
        return bench

    def _response_key(self, name: str) -> str:
        entry = cfg.dataset_settings(self.config, name)
        generation = {k: entry["generation"].get(k) for k in SEMANTIC_GENERATION}
        if generation["backend"] in ("openai", "sglang"):
            generation["served_model"] = self.config["generation"]["openai"]["model"]
        elif cfg.generation_dtype(self.config) != self.config["model"]["dtype"]:
            # The model key holds model.dtype; a different generation dtype changes the output.
            generation["hf_dtype"] = cfg.generation_dtype(self.config)
        params = {
            "source": self._source_hash(entry["path"]),
            "format": entry["format"],
            "prompt_field": entry["prompt_field"] if entry["format"] == "prompt" else None,
            "split": entry["split"],
            "max_samples": entry["max_samples"],
            "max_prompt_tokens": entry["max_prompt_tokens"],
            "generation": generation,
        }
        return stage_key("responses", params, {"model": self.model_key})

    def _token_key(self, name: str) -> str:
        tokenize = self.config["tokenize"]
        return stage_key(
            "tokens",
            {"max_length": tokenize["max_length"]},
            {"model": self.model_key, "responses": self.response_keys[name]},
        )

    # --- paths ---------------------------------------------------------------
    @property
    def model_dir(self) -> Path:
        return self.root / "model" / self.model_key

    def responses_dir(self, name: str) -> Path:
        return self.root / "responses" / name / self.response_keys[name]

    def tokens_dir(self, name: str) -> Path:
        return self.root / "tokens" / name / self.token_keys[name]

    @property
    def merged_dir(self) -> Path:
        return self.root / "merged" / self.merged_key

    @property
    def hidden_dir(self) -> Path:
        return self.root / "hidden" / self.hidden_key

    @property
    def shard_names(self) -> list[str]:
        return [shard_name(i) for i in range(self.config["extract"]["num_shards"])]

    @property
    def draft_vocab_dir(self) -> Path:
        return self.root / "draft_vocab" / self.draft_vocab_key

    @property
    def draft_dir(self) -> Path:
        return self.root / "draft" / self.draft_key

    @property
    def num_segments(self) -> int:
        train = self.config["train"]
        return -(-train["total_steps"] // train["checkpoint_every"])

    @property
    def segment_names(self) -> list[str]:
        return [segment_name(i) for i in range(self.num_segments)]

    def checkpoint(self, segment: int) -> Path:
        return self.draft_dir / f"ckpt-{segment_name(segment)}.pt"

    def metrics(self, segment: int) -> Path:
        return self.draft_dir / f"metrics-{segment_name(segment)}.jsonl"

    @property
    def export_dir(self) -> Path:
        """Holds `sglang/` and `vllm/`, one directory per serving format."""
        return self.root / "export" / self.export_key

    @property
    def eval_dir(self) -> Path:
        return self.root / "eval" / self.eval_key

    @property
    def serve_bench_dir(self) -> Path:
        return self.root / "serve_bench" / self.serve_bench_key

    @property
    def results_dir(self) -> Path:
        return Path("results") / self.config["experiment"]


def shard_name(index: int) -> str:
    return f"shard-{index:05d}"


def segment_name(index: int) -> str:
    return f"{index:05d}"
