"""The settings the export stage reads, resolved once by `workflow.configure`.

No torch here: the Snakefile builds these while parsing.
"""

from __future__ import annotations

from dataclasses import dataclass

from draftsmith.config import export_serving_context


@dataclass(frozen=True)
class ExportSettings:
    """How the trained draft is written for SGLang and vLLM, and how the target is loaded."""

    dtype: str  # stored weight dtype, both formats
    serving_context: int  # export.serving_context, else train.max_position_embeddings
    speculative_tokens: int  # the chain length of the vLLM speculators config
    verifier_name_or_path: str | None  # None: the converted target directory
    allow_ambiguous_sglang_ids: bool
    trust_remote_code: bool  # model.trust_remote_code, for loading the target's embeddings

    @classmethod
    def of(cls, config: dict) -> ExportSettings:
        export = config["export"]
        return cls(
            dtype=export["dtype"],
            serving_context=export_serving_context(config),
            speculative_tokens=export["speculative_tokens"],
            verifier_name_or_path=export["verifier_name_or_path"],
            allow_ambiguous_sglang_ids=export["allow_ambiguous_sglang_ids"],
            trust_remote_code=config["model"]["trust_remote_code"],
        )
