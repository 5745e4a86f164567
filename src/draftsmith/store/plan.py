"""The artifact plan: every artifact a config asks for, with its key, directory and files.

Every stage's outputs sit under `<artifacts>/<stage>/[<dataset>/]<key>/` (the names and
paths: `store.layout`), where the key hashes the stage's semantic parameters, its format
version and its upstream keys (`keys.stage_key`). Two configs that agree on a stage's inputs
and parameters get the same key and share the files; differing outputs sit side by side.
Performance settings (batch size, concurrency, timeouts, prices) are not semantic and
are left out on purpose. A manifest records exactly the params and upstream keys the
key hashed (`Artifact`), so the two cannot drift.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from draftsmith import config as cfg
from draftsmith.errors import DraftsmithError, InputChangedError
from draftsmith.store.hashing import HashCache
from draftsmith.store.keys import stage_key
from draftsmith.store.layout import (
    FILES,
    HASH_CACHE,
    MANIFEST,
    RESULTS,
    answer_store,
    declared,
    key_directory,
    segment_name,
    shard_path,
    shard_samples_path,
)

# Serving-benchmark settings that do not change what is measured (where, how patiently).
_SERVE_BENCH_IGNORED = ("python", "port", "startup_timeout_s", "request_timeout_s")

# Evaluator settings behind every measurement it makes, the settings search's included: the
# results hold tokens/s, so the device counts (a CPU measurement must not stand in for a
# GPU one), as do the untimed warm-up decodes; dtype can change the target's own greedy output.
SEMANTIC_DECODING = ("max_new_tokens", "device", "dtype", "warmup_prompts")

# Settings-search settings that change what it measures: the grid's lists (their order does
# not) and the halving schedule. `enabled` and `confirm_top` (what the serving benchmark
# does with the result) do not.
SEARCH_GRID = ("num_steps", "topk", "num_draft_tokens")
SEARCH_SCHEDULE = ("first_prompts", "eta")

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


@dataclass(frozen=True)
class Artifact:
    """One keyed artifact: what its key hashes, where it lives, what its files are called."""

    stage: str
    params: dict
    upstream: dict[str, str]
    directory: Path
    key: str
    dataset: str = ""  # per-dataset stages (responses, tokens) only

    def path(self, role: str) -> Path:
        return self.directory / FILES[self.stage][role]

    @property
    def manifest(self) -> Path:
        return self.directory / MANIFEST

    @property
    def outputs(self) -> dict[str, str]:
        """Every declared file by role, the manifest last (a rule's `output:`)."""
        return declared(self.directory, self.stage)


def keyed(root: Path, stage: str, params: dict, upstream: dict[str, str], dataset: str = "") -> Artifact:
    key = stage_key(stage, params, upstream)
    directory = root / stage / dataset / key if dataset else root / stage / key
    return Artifact(stage, params, upstream, directory, key, dataset)


def check_planned(plan: Plan, outputs: list[str]) -> None:
    """Refuse a job whose declared outputs lie under a key its config and inputs no longer
    give: an input changed between Snakemake's planning and the job's start, and writing
    now would put one content under another content's key (nothing is written)."""
    root = plan.root.resolve()
    planned = {a.directory.resolve(): a for a in plan.artifacts}
    for output in outputs:
        try:
            relative = Path(output).resolve().relative_to(root)
        except ValueError:
            continue  # not in the store (results/, logs)
        directory = key_directory(relative)
        if directory is None or root / directory in planned:
            continue
        now = [a for a in plan.artifacts if a.directory.parent.resolve() == (root / directory).parent]
        hashes = "; ".join(
            f"{a.directory.relative_to(plan.root)} from {_content_hashes(a.params)}" for a in now
        )
        raise InputChangedError(
            f"{output}: an input changed after this job was planned: its outputs are keyed "
            f"{directory.name}, the config and inputs now give {hashes or 'no such artifact'}. "
            "Nothing was written; run snakemake again to plan it anew."
        )


def _content_hashes(params: dict) -> str:
    """The content hashes a key's params hold (`source`, `sha256`), for an error message."""
    found = []

    def walk(value: object, where: str) -> None:
        if isinstance(value, dict):
            for name, item in value.items():
                if name in ("source", "sha256") and isinstance(item, str):
                    found.append(f"{where}{name} sha256 {item}")
                else:
                    walk(item, f"{where}{name}.")

    walk(params, "")
    return ", ".join(found) or "its upstream keys"


class DamagedViewError(DraftsmithError):
    pass


def _segment(segment: int | str) -> str:
    return segment if isinstance(segment, str) else segment_name(segment)


def forget_source_hashes(root: Path) -> None:
    """Drop the store's hash cache, so that the next plan hashes every source again. The cache
    trusts (size, mtime, inode): an edit that keeps all three keeps the old hash until then."""
    (root / HASH_CACHE).unlink(missing_ok=True)


def plan_for(config: dict) -> Plan:
    """The plan of a validated config, hashing sources through the store's cache."""
    return Plan(config, HashCache(Path(config["artifacts_dir"]) / HASH_CACHE))


@dataclass
class Plan:
    """Keys and paths of every artifact a config asks for, computed at parse time."""

    config: dict
    hash_cache: HashCache
    missing_sources: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.root = Path(self.config["artifacts_dir"])
        root = self.root
        self.model = keyed(root, "model", self._model_params(), {})
        self.responses = {
            n: keyed(root, "responses", self._response_params(n), {"model": self.model.key}, dataset=n)
            for n in self.generated_datasets
        }
        # Where each dataset's answers are stored (datasets with one generation key share it).
        self.answers = {
            n: answer_store(root, a.upstream["model"], a.params["generation"])
            for n, a in self.responses.items()
        }
        self.tokens = {
            n: keyed(
                root,
                "tokens",
                {"max_length": self.config["tokenize"]["max_length"]},
                {"model": self.model.key, "responses": self.responses[n].key},
                dataset=n,
            )
            for n in self.generated_datasets
        }
        self.merged = keyed(
            root,
            "merged",
            {"seed": self.config["merge"]["seed"], "caps": self.merge_caps()},
            {f"tokens/{n}": self.tokens[n].key for n in self.merged_datasets},
        )
        data = {"model": self.model.key, "merged": self.merged.key}
        # The states store: every sample's states under what determines them (the model
        # and the extraction settings), whatever mix it came from. The mix's view (which
        # stored shard holds each of its samples) is keyed by the store and the mix.
        self.states = keyed(root, "hidden", self._hidden_params(), {"model": self.model.key})
        self.hidden = keyed(root, "hidden", {}, {"states": self.states.key, "merged": self.merged.key})
        train = self.config["train"]
        self.vocab = keyed(
            root,
            "vocab",
            {"draft_vocab_size": train["draft_vocab_size"], "val_fraction": train["val_fraction"]},
            data,
        )
        self.train = keyed(
            root,
            "train",
            {k: train[k] for k in SEMANTIC_TRAIN},
            {
                "model": self.model.key,
                "states": self.states.key,
                "merged": self.merged.key,
                "vocab": self.vocab.key,
            },
        )
        self.export = keyed(root, "export", self._export_params(), {"train": self.train.key})
        self.evaluate = keyed(
            root,
            "evaluate",
            self._evaluate_params(),
            {"model": self.model.key, "export": self.export.key, "merged": self.merged.key},
        )
        self.search = keyed(
            root,
            "search",
            self._search_params(),
            {"model": self.model.key, "export": self.export.key, "merged": self.merged.key},
        )
        self.serve_bench = keyed(
            root, "serve_bench", self._serve_bench_params(), self._serve_bench_upstream()
        )
        self.hash_cache.save()
        for path in self.missing_sources:
            print(
                f"draftsmith: source not found: {path} (planned with a placeholder key; "
                "the job that reads it fails until it exists)",
                file=sys.stderr,
            )

    @property
    def artifacts(self) -> list[Artifact]:
        """Every keyed artifact this config plans, upstream first."""
        return [
            self.model,
            *self.responses.values(),
            *self.tokens.values(),
            self.merged,
            self.states,
            self.hidden,
            self.vocab,
            self.train,
            self.export,
            self.evaluate,
            self.search,
            self.serve_bench,
        ]

    @property
    def built(self) -> list[Artifact]:
        """The artifacts a full run of this config builds (evaluation, the settings search
        and the serving benchmark only when enabled)."""
        # The states store has no manifest: each shard's index is its own (`shard`).
        return [a for a in self.artifacts if cfg.stage_on(self.config, a.stage) and a is not self.states]

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
            "storage": extract["storage"],
            "dtype": extract["dtype"] or self.config["model"]["dtype"],
            "aux_layers": extract["aux_layers"] or "default",
        }

    def _export_params(self) -> dict:
        return {**self.config["export"], "serving_context": cfg.export_serving_context(self.config)}

    def _evaluate_params(self) -> dict:
        evaluate = self.config["evaluate"]
        sets = {name: self._prompt_set_params(e) for name, e in sorted(evaluate["prompt_sets"].items())}
        return {
            "k": evaluate["k"],
            "trees": evaluate["trees"],
            **{name: evaluate[name] for name in SEMANTIC_DECODING},
            # The buckets and the drop thresholds shape benchmark.json's by_length, long_context
            # and by_set.
            "length_buckets": evaluate["length_buckets"],
            "long_context_drop": evaluate["long_context_drop"],
            "prompt_set_drop": evaluate["prompt_set_drop"],
            "prompt_sets": sets,
        }

    def _prompt_set_params(self, entry: dict) -> dict:
        """A prompt set's settings, its file by content (not where it lies)."""
        return {"source": self._source_hash(entry["path"]), **{k: v for k, v in entry.items() if k != "path"}}

    def _search_params(self) -> dict:
        search, evaluate = self.config["search"], self.config["evaluate"]
        name = cfg.search_prompt_set(self.config)
        entry = evaluate["prompt_sets"].get(name)
        return {
            **{name: sorted(search[name]) for name in SEARCH_GRID},
            **{name: search[name] for name in SEARCH_SCHEDULE},
            **{name: evaluate[name] for name in SEMANTIC_DECODING},
            "prompt_set": name,
            "prompts": self._prompt_set_params(entry) if entry is not None else None,
        }

    def _serve_bench_params(self) -> dict:
        # Speed is what a benchmark measures, so launch and load settings are part of its key.
        bench = {k: v for k, v in self.config["serve_benchmark"].items() if k != "enabled"}
        bench["sglang"] = {k: v for k, v in bench["sglang"].items() if k not in _SERVE_BENCH_IGNORED}
        entry = self.config["evaluate"]["prompt_sets"].get(bench["prompt_set"])
        if entry is not None:
            bench["prompts"] = self._prompt_set_params(entry)
            bench["system_prompt"] = self.config["generation"]["system_prompt"]
        if cfg.served_search_settings(self.config):
            bench["search_settings"] = cfg.served_search_settings(self.config)
        return bench

    def _serve_bench_upstream(self) -> dict[str, str]:
        upstream = {"model": self.model.key, "export": self.export.key}
        if cfg.served_search_settings(self.config):
            upstream["search"] = self.search.key  # it serves the search's best settings
        return upstream

    def _response_params(self, name: str) -> dict:
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
        # Absent at their defaults: the keys of before role maps and regeneration modes.
        if entry["roles"] and entry["format"] != "prompt":
            params["roles"] = entry["roles"]
        if entry["regenerate"] != "last" and entry["format"] != "prompt":
            params["regenerate"] = entry["regenerate"]
        return params

    # --- paths that are not one of an artifact's fixed files -------------------------
    def shard(self, name: str, part: str = "index") -> Path:
        """A stored shard's `index` (its JSON manifest) or `bin` file (`name` may be a
        wildcard)."""
        return shard_path(self.states.directory, name, part)

    def mix_shard_names(self) -> list[str]:
        """The stored shards the mix reads, once its view is written (none before)."""
        view = self.hidden.path("assignment")
        if not view.exists():
            return []
        try:
            return json.loads(view.read_text(encoding="utf-8"))["shards"]
        except (ValueError, KeyError) as exc:  # bytes damaged on disk: say where, not a traceback
            raise DamagedViewError(f"{view}: damaged ({exc}); run: draftsmith verify --fix") from exc

    def shard_samples(self, name: str) -> Path:
        """The samples a stored shard holds or will hold (`name` may be a wildcard)."""
        return shard_samples_path(self.states.directory, name)

    @property
    def num_segments(self) -> int:
        train = self.config["train"]
        return -(-train["total_steps"] // train["checkpoint_every"])

    @property
    def segment_names(self) -> list[str]:
        return [segment_name(i) for i in range(self.num_segments)]

    def checkpoint(self, segment: int | str) -> Path:
        """Segment n's full training state (a string is used as is: a wildcard)."""
        return self.train.directory / f"ckpt-{_segment(segment)}.pt"

    def metrics(self, segment: int | str) -> Path:
        return self.train.directory / f"metrics-{_segment(segment)}.jsonl"

    @property
    def results_dir(self) -> Path:
        return Path("results") / self.config["experiment"]

    def result(self, role: str) -> Path:
        return self.results_dir / RESULTS[role]
