"""The settings the model stage reads, resolved once by `workflow.configure`.

No torch here: the Snakefile builds these while parsing.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelSource:
    """`model.source`: where the target comes from (`model.source` says how each kind is read)."""

    kind: str  # pypi, gguf or hf_dir
    path: str | None = None  # gguf and hf_dir
    package: str | None = None  # pypi: the wheel holding the GGUF file...
    version: str | None = None
    file: str | None = None  # ...and the file's path inside it
    sha256: str | None = None  # pinned for pypi, optional for gguf

    @classmethod
    def of(cls, source: dict) -> ModelSource:
        return cls(
            kind=source["kind"],
            path=source.get("path"),
            package=source.get("package"),
            version=source.get("version"),
            file=source.get("file"),
            sha256=source.get("sha256"),
        )


@dataclass(frozen=True)
class ModelSettings:
    """What the model job reads of `model`: the source, the weights' dtype, what to record."""

    source: ModelSource
    dtype: str  # of the converted weights, and of the probe generation
    trust_remote_code: bool
    probe_generation: bool
    end_of_turn_ids: tuple[int, ...] | None  # None: whatever the chat template renders

    @classmethod
    def of(cls, config: dict) -> ModelSettings:
        model = config["model"]
        eot = model.get("end_of_turn_ids")
        return cls(
            source=ModelSource.of(model["source"]),
            dtype=model["dtype"],
            trust_remote_code=model["trust_remote_code"],
            probe_generation=model["probe_generation"],
            end_of_turn_ids=None if eot is None else tuple(eot),
        )
