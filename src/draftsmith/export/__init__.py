"""Export: the trained draft in SGLang and vLLM speculators formats (`formats`); what
other stages read an export with."""

from draftsmith.export.formats import AUX_LAYER_CONVENTION, SGLANG, SGLANG_ARCHITECTURE, load_sglang_export

__all__ = ["AUX_LAYER_CONVENTION", "SGLANG", "SGLANG_ARCHITECTURE", "load_sglang_export"]
