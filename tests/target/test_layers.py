"""Aux layer-id conventions, pinned to real HF behaviour with the demo model."""

from __future__ import annotations

import pytest

from draftsmith.errors import DraftsmithError
from draftsmith.target.layers import (
    AuxLayers,
    LayerIdError,
    default_aux_layers,
    sglang_layer_ids,
)


@pytest.mark.parametrize(
    ("num_layers", "output_of", "shifted"),
    [
        (30, (1, 14, 26), (2, 15, 27)),  # the demo target (SmolLM2-135M)
        (32, (1, 15, 28), (2, 16, 29)),  # Llama-3.1-8B
        (61, (1, 29, 57), (2, 30, 58)),  # Kimi-K2.5 / DeepSeek-V3
    ],
)
def test_defaults_in_all_conventions(num_layers, output_of, shifted):
    aux = AuxLayers.default(num_layers)
    assert default_aux_layers(num_layers) == list(output_of)
    assert aux.output_of == output_of
    assert aux.hf_hidden_states == shifted
    assert aux.input_of == shifted
    assert aux.is_default
    # SGLang adds 1 to the ids it is given, so it takes output-of ids.
    assert sglang_layer_ids(aux) == list(output_of)


@pytest.mark.parametrize("num_layers", [8, 30, 32, 61, 80])
def test_round_trips_between_conventions(num_layers):
    aux = AuxLayers.default(num_layers)
    assert AuxLayers.from_input_of(aux.input_of, num_layers) == aux
    assert AuxLayers.from_hf_hidden_states(aux.hf_hidden_states, num_layers) == aux
    assert AuxLayers.from_output_of(list(aux.output_of), num_layers) == aux
    for convention, ids in aux.as_manifest().items():
        if convention != "num_hidden_layers":
            assert AuxLayers.from_convention(convention, ids, num_layers) == aux
    assert AuxLayers.from_manifest(aux.as_manifest()) == aux


def test_manifest_names_every_convention():
    assert AuxLayers.default(32).as_manifest() == {
        "output_of_layer": [1, 15, 28],
        "hf_hidden_states_index": [2, 16, 29],
        "input_of_layer": [2, 16, 29],
        "num_hidden_layers": 32,
    }


def test_inconsistent_manifest_is_refused():
    manifest = AuxLayers.default(32).as_manifest()
    manifest["input_of_layer"] = [1, 15, 28]  # written in the wrong convention
    with pytest.raises(LayerIdError, match="inconsistent"):
        AuxLayers.from_manifest(manifest)


@pytest.mark.parametrize(
    ("ids", "message"),
    [
        ([1, 14], "exactly 3"),
        ([1, 14, 20, 26], "exactly 3"),
        ([1, 14, 14], "distinct"),
        ([14, 1, 26], "ascending"),
        ([-1, 14, 26], r"0\.\.28"),
        ([1, 14, 30], r"0\.\.28"),
        ([1, 14, 29], "not capturable"),  # the last layer's output
        ([1, 14, 26.0], "integers"),
        ([1, True, 26], "integers"),
        ("1,14,26", "integers"),
    ],
)
def test_invalid_ids_are_refused(ids, message):
    with pytest.raises(LayerIdError, match=message) as info:
        AuxLayers.from_output_of(ids, 30)
    assert isinstance(info.value, DraftsmithError)


def test_shifted_conventions_refuse_the_embedding_index():
    with pytest.raises(LayerIdError, match="embedding"):
        AuxLayers.from_hf_hidden_states([0, 15, 27], 30)
    with pytest.raises(LayerIdError, match="0..28"):
        AuxLayers.from_input_of([2, 15, 30], 30)  # "input of layer 30" does not exist
    with pytest.raises(LayerIdError, match="unknown aux layer convention"):
        AuxLayers.from_convention("input_of", [2, 15, 27], 30)


def test_too_few_layers_for_the_default():
    with pytest.raises(LayerIdError):
        default_aux_layers(6)
    with pytest.raises(LayerIdError, match="positive integer"):
        default_aux_layers(0)


@pytest.fixture(scope="module")
def demo_forward(demo_model_dir):
    """One forward of the real demo model: hidden_states, layer outputs, final-norm output."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(demo_model_dir, dtype=torch.float32).eval()
    layers, captured = model.model.layers, {}

    def keep(name):
        def hook(_module, _args, output):
            captured[name] = (output[0] if isinstance(output, tuple) else output).detach().clone()

        return hook

    handles = [layer.register_forward_hook(keep(i)) for i, layer in enumerate(layers)]
    handles.append(model.model.norm.register_forward_hook(keep("norm")))
    ids = torch.tensor([[1, 9690, 198, 2683, 359, 253, 5356, 30, 2]])
    with torch.no_grad():
        out = model(input_ids=ids, output_hidden_states=True)
    for handle in handles:
        handle.remove()
    return len(layers), out.hidden_states, captured


def test_output_of_layer_is_hf_hidden_states_plus_one(demo_forward):
    import torch

    num_layers, hidden_states, captured = demo_forward
    aux = AuxLayers.default(num_layers)
    assert num_layers == 30 and len(hidden_states) == num_layers + 1
    for layer, index in zip(aux.output_of, aux.hf_hidden_states, strict=True):
        assert torch.equal(captured[layer], hidden_states[index])
    # ... and every other layer as well, so the offset is not a coincidence of these ids.
    for layer in range(num_layers - 1):
        assert torch.equal(captured[layer], hidden_states[layer + 1])


def test_last_hf_hidden_state_is_the_final_norm_output(demo_forward):
    import torch

    num_layers, hidden_states, captured = demo_forward
    assert torch.equal(hidden_states[-1], captured["norm"])
    # Not the last layer's raw output: why output_of N-1 is refused.
    assert not torch.allclose(hidden_states[-1], captured[num_layers - 1])
