"""EAGLE-3 aux layer ids: the one place that knows how each tool numbers them.

EAGLE-3 feeds the draft three target layers (low, mid, high). The same three
layers carry different numbers in different tools:

- `output_of_layer` (SpecForge, TRT-LLM, and what `AuxLayers` stores): the
  output of decoder layer i, 0-based. Default `[1, N//2-1, N-4]`.
- `hf_hidden_states_index`: the index into HF `output_hidden_states`, whose
  entry 0 is the embedding output, so layer i's output is entry i+1.
- `input_of_layer`: the residual stream entering decoder layer i+1. SGLang's
  internal `layers_to_capture` and vLLM's `eagle_aux_hidden_state_layer_ids`
  use it; both default to `[2, N//2, N-3]`.

The config key SGLang reads is NOT input-of: SGLang's
`set_eagle3_layers_to_capture(ids)` adds 1 itself ("for the ith layer, it
takes the output of the (i-1)th layer", sglang/srt/models/llama.py, checked in
sglang 0.5.23), so `--return-aux-hidden-state-layer-ids` and a draft's
`eagle_config.eagle_aux_hidden_state_layer_ids` are output-of ids there. Use
`sglang_layer_ids` for SGLang; never hand it `input_of`.

The last decoder layer's output (i = N-1) is excluded on purpose: HF's last
`hidden_states` entry is taken after the final norm (not the raw output), and
SGLang/vLLM capture a layer's input, so nothing captures "input of layer N".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from draftsmith.errors import DraftsmithError

OUTPUT_OF = "output_of_layer"
INPUT_OF = "input_of_layer"
HF_INDEX = "hf_hidden_states_index"
CONVENTIONS = (OUTPUT_OF, INPUT_OF, HF_INDEX)
NUM_AUX = 3


class LayerIdError(DraftsmithError, ValueError):
    """Aux layer ids that do not name three distinct, capturable target layers."""


def default_aux_layers(num_layers: int) -> list[int]:
    """EAGLE-3's default aux layers as output-of-decoder-layer ids (0-based)."""
    return list(AuxLayers.from_output_of(_default_ids(num_layers), num_layers).output_of)


def _default_ids(num_layers: int) -> list[int]:
    return [1, num_layers // 2 - 1, num_layers - 4]


@dataclass(frozen=True)
class AuxLayers:
    """Three aux layers of a target with `num_layers` decoder layers, stored output-of."""

    output_of: tuple[int, ...]
    num_layers: int

    def __post_init__(self) -> None:
        _check_count(self.num_layers)
        ids = tuple(self.output_of)
        object.__setattr__(self, "output_of", ids)
        _check_ids(ids, self.num_layers)

    @property
    def hf_hidden_states(self) -> tuple[int, ...]:
        return tuple(i + 1 for i in self.output_of)

    @property
    def input_of(self) -> tuple[int, ...]:
        return tuple(i + 1 for i in self.output_of)

    @property
    def is_default(self) -> bool:
        return list(self.output_of) == _default_ids(self.num_layers)

    @classmethod
    def default(cls, num_layers: int) -> AuxLayers:
        return cls.from_output_of(_default_ids(num_layers), num_layers)

    @classmethod
    def from_output_of(cls, ids: Sequence[int], num_layers: int) -> AuxLayers:
        return cls(tuple(_as_ints(ids, OUTPUT_OF)), num_layers)

    @classmethod
    def from_input_of(cls, ids: Sequence[int], num_layers: int) -> AuxLayers:
        return cls._shifted(ids, num_layers, INPUT_OF)

    @classmethod
    def from_hf_hidden_states(cls, ids: Sequence[int], num_layers: int) -> AuxLayers:
        return cls._shifted(ids, num_layers, HF_INDEX)

    @classmethod
    def from_convention(cls, convention: str, ids: Sequence[int], num_layers: int) -> AuxLayers:
        if convention == OUTPUT_OF:
            return cls.from_output_of(ids, num_layers)
        if convention in (INPUT_OF, HF_INDEX):
            return cls._shifted(ids, num_layers, convention)
        raise LayerIdError(
            f"unknown aux layer convention {convention!r}; expected one of {list(CONVENTIONS)}"
        )

    @classmethod
    def _shifted(cls, ids: Sequence[int], num_layers: int, convention: str) -> AuxLayers:
        values = _as_ints(ids, convention)
        if any(i < 1 for i in values):
            # Index 0 is the embedding output, which no decoder layer produces.
            raise LayerIdError(f"{convention} ids {values} must be >= 1 (0 is the embedding output)")
        return cls(tuple(i - 1 for i in values), num_layers)

    def as_manifest(self) -> dict:
        """All three conventions by name, so no reader has to guess which one a list is."""
        return {
            OUTPUT_OF: list(self.output_of),
            HF_INDEX: list(self.hf_hidden_states),
            INPUT_OF: list(self.input_of),
            "num_hidden_layers": self.num_layers,
        }

    @classmethod
    def from_manifest(cls, manifest: dict) -> AuxLayers:
        """Read `as_manifest` back, refusing a record whose conventions disagree."""
        aux = cls.from_output_of(manifest[OUTPUT_OF], manifest["num_hidden_layers"])
        if aux.as_manifest() != {key: manifest.get(key) for key in aux.as_manifest()}:
            raise LayerIdError(f"aux layer manifest is inconsistent across conventions: {manifest}")
        return aux


def sglang_layer_ids(aux: AuxLayers) -> list[int]:
    """Ids for SGLang's `--return-aux-hidden-state-layer-ids` / draft `eagle_aux_hidden_state_layer_ids`.

    Output-of: SGLang adds 1 itself (see the module docstring).
    """
    return list(aux.output_of)


def _check_count(num_layers: int) -> None:
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 1:
        raise LayerIdError(f"num_hidden_layers must be a positive integer, got {num_layers!r}")


def _as_ints(ids: Sequence[int], convention: str) -> list[int]:
    values = list(ids) if isinstance(ids, Sequence) and not isinstance(ids, str) else None
    if values is None or any(isinstance(i, bool) or not isinstance(i, int) for i in values):
        raise LayerIdError(f"{convention} ids must be a list of integers, got {ids!r}")
    return values


def _check_ids(ids: tuple[int, ...], num_layers: int) -> None:
    where = f"aux layers (output_of_layer) {list(ids)} for {num_layers} decoder layers"
    if len(ids) != NUM_AUX:
        raise LayerIdError(f"{where}: EAGLE-3 takes exactly {NUM_AUX} aux layers")
    if any(isinstance(i, bool) or not isinstance(i, int) for i in ids):
        raise LayerIdError(f"{where}: ids must be integers")
    if len(set(ids)) != len(ids):
        raise LayerIdError(f"{where}: ids must be distinct")
    if list(ids) != sorted(ids):
        raise LayerIdError(f"{where}: ids must be in ascending order (low, mid, high)")
    if ids[0] < 0 or ids[-1] > num_layers - 2:
        raise LayerIdError(
            f"{where}: each id must lie in 0..{num_layers - 2}; the last layer's output is "
            "not capturable (HF's last hidden_states entry is post-norm, SGLang/vLLM capture "
            "layer inputs)"
        )
