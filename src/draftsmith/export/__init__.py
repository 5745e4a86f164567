"""Export: the trained draft in SGLang and vLLM speculators formats: their names (`names`,
no torch), the stage's settings (`settings`, no torch), writing (`write`), validation by
reload (`validate`) and loading (`load`); what other stages read an export with.

`load_sglang_export` imports torch, so it loads on first use: the names stay torch-free."""

from typing import Any

from draftsmith.export.names import AUX_LAYER_CONVENTION, SGLANG, SGLANG_ARCHITECTURE


def __getattr__(name: str) -> Any:
    if name == "load_sglang_export":
        from draftsmith.export.load import load_sglang_export

        return load_sglang_export
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["AUX_LAYER_CONVENTION", "SGLANG", "SGLANG_ARCHITECTURE", "load_sglang_export"]
