"""Export names: the two formats, their file, architecture and key names, and the
aux-layer numbering each consumer reads; no torch (what only needs the names imports this).

Two formats, one set of weights:

- SGLang (also EAGLE official, ModelOpt): `LlamaForCausalLMEagle3`, the decoder layer
  as `midlayer.*`, no `embed_tokens` (SGLang shares the target's embedding).
- vLLM speculators: `Eagle3Speculator`, the decoder layer as `layers.0.*`, with
  `embed_tokens`; keys carry no `model.` prefix (vLLM's `Eagle3LlamaForCausalLM.
  load_weights` adds it, and speculators' `Eagle3DraftModel` names its modules so).

`KEY_MAPS` is the only place that knows the file key names and `aux_layer_ids` the only
place that knows which aux-layer numbering each consumer reads.
"""

from __future__ import annotations

from draftsmith.errors import DraftsmithError
from draftsmith.store.layout import EXPORT_FILES
from draftsmith.target.layers import INPUT_OF, OUTPUT_OF, AuxLayers, sglang_layer_ids

SGLANG = "sglang"
VLLM = "vllm"
FORMATS = (SGLANG, VLLM)

CONFIG_FILE = EXPORT_FILES["config"]
WEIGHTS_FILE = EXPORT_FILES["weights"]
MANIFEST_FILE = EXPORT_FILES["record"]

SGLANG_ARCHITECTURE = "LlamaForCausalLMEagle3"
VLLM_ARCHITECTURE = "Eagle3Speculator"
# Informational: vLLM does not read it. 0.3.0 is a released speculators version (its
# announcement shows an eagle3 config.json of this shape); not checked against its schema.
SPECULATORS_VERSION = "0.3.0"


# ---------------------------------------------------------------------------------
# Key names: draft parameter name (SGLang's, see model.py) -> key in each format's file.
# SGLang: identity, no embed_tokens (python/sglang/srt/models/llama_eagle3.py loads
# `midlayer.*`, `fc`, `norm`, `lm_head`, reads `d2t`, skips `t2d`, ignores the rest).
# vLLM speculators: `midlayer.` -> `layers.0.`, plus embed_tokens (speculators
# src/speculators/models/eagle3/core.py: Eagle3DraftModel.{embed_tokens, fc, layers,
# norm, lm_head, d2t, t2d}; first layer norms hidden_norm / input_layernorm /
# post_attention_layernorm in eagle3/model_definitions.py; vLLM
# vllm/model_executor/models/llama_eagle3.py adds the `model.` prefix itself and
# raises on keys it does not know).
# ---------------------------------------------------------------------------------
_LAYER_PARAMS = (
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
    "hidden_norm.weight",
    "input_layernorm.weight",
    "post_attention_layernorm.weight",
)
_SHARED_KEYS = ("fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d")
EMBED_KEY = "embed_tokens.weight"

KEY_MAPS: dict[str, dict[str, str]] = {
    SGLANG: {
        **{f"midlayer.{p}": f"midlayer.{p}" for p in _LAYER_PARAMS},
        **{k: k for k in _SHARED_KEYS},
    },
    VLLM: {
        **{f"midlayer.{p}": f"layers.0.{p}" for p in _LAYER_PARAMS},
        **{k: k for k in _SHARED_KEYS},
        EMBED_KEY: EMBED_KEY,
    },
}


# ---------------------------------------------------------------------------------
# Aux layer ids in each consumer's draft config (`eagle_aux_hidden_state_layer_ids`).
# - SGLang reads `eagle_config.eagle_aux_hidden_state_layer_ids` (model_runner.py) and
#   passes it to the target's `set_eagle3_layers_to_capture`, which adds 1
#   (python/sglang/srt/models/llama.py: "for the ith layer, it takes the output of the
#   (i-1)th layer"), so the key holds OUTPUT-OF ids: default [1, N//2-1, N-4].
#   Newer SGLang (PR #25454, models/deepseek_v2.py, the Kimi/DeepSeek path) adds 1 only
#   when the first id is 1 and otherwise reads the ids as input-of, so output-of ids
#   whose first id is not 1 mean different layers in different SGLang versions.
# - vLLM reads top-level `eagle_aux_hidden_state_layer_ids` (speculators algos.py
#   copies it; gpu_model_runner._get_eagle3_aux_layers_from_config and
#   v1/worker/gpu/spec_decode/eagle/eagle3_utils.py pass it on unchanged) and captures
#   the residual stream ENTERING layer idx (models/llama.py: `if idx in
#   self.aux_hidden_state_layers: aux_hidden_states.append(hidden_states + residual)`),
#   so the key holds INPUT-OF ids: default [2, N//2, N-3]. Recent vLLM can be told
#   `eagle_aux_layer_semantics: "sglang"`; absent, it is "vllm" (input-of), which is
#   what is written here.
# REFERENCE.md's "input of layer [2, N//2, N-3] (SGLang, vLLM)" is right for SGLang's
# internal `layers_to_capture`, not for the id list an SGLang draft config carries.
# ---------------------------------------------------------------------------------
AUX_LAYER_CONVENTION = {SGLANG: OUTPUT_OF, VLLM: INPUT_OF}


class ExportError(DraftsmithError):
    """An export that would not load, or would load as something other than the trained draft."""


def aux_layer_ids(fmt: str, aux: AuxLayers, *, allow_ambiguous_sglang_ids: bool = False) -> list[int]:
    """The `eagle_aux_hidden_state_layer_ids` a `fmt` draft config must carry for `aux`."""
    if fmt == SGLANG:
        ids = sglang_layer_ids(aux)  # output-of (layers.py documents SGLang's +1)
        if ids[0] != 1 and not allow_ambiguous_sglang_ids:
            raise ExportError(
                f"aux layers (output_of_layer) {ids} start at {ids[0]}, not 1: SGLang versions "
                "disagree on such ids (llama.py always adds 1; deepseek_v2.py since PR #25454 "
                "adds 1 only when the first id is 1), so the served draft could get other layers "
                "than it was trained on. Train with aux layers starting at output-of layer 1 (the "
                "EAGLE-3 default), or pass allow_ambiguous_sglang_ids=True for a pinned SGLang "
                "whose target model adds 1 unconditionally."
            )
        return ids
    if fmt == VLLM:
        return list(aux.input_of)
    raise ExportError(f"unknown export format {fmt!r}; expected one of {list(FORMATS)}")
