"""The hidden-state stage's settings: values derived from other sections, the aux layers
a target gets, and configured aux layers that cannot be read."""

from __future__ import annotations

import pytest

from draftsmith import config as cfg
from draftsmith.errors import ConfigError
from draftsmith.hidden.settings import AuxLayerChoice, HiddenSettings
from draftsmith.target.layers import AuxLayers, LayerIdError


def validated(**extract) -> dict:
    return cfg.validate(
        {
            "experiment": "t",
            "model": {"source": {"kind": "hf_dir", "path": "unused"}, "dtype": "bfloat16"},
            "datasets": {"a": {"path": "a.jsonl", "format": "prompt"}},
            "evaluate": {"enabled": False},
            "extract": extract,
        }
    )


def test_derived_values():
    hf = HiddenSettings.of(validated())
    assert hf.dtype == "bfloat16"  # extract.dtype falls back to model.dtype
    assert hf.gpus == 0 and hf.sglang is None and hf.aux_layers is None
    assert HiddenSettings.of(validated(dtype="float32", device="cuda")).dtype == "float32"
    assert HiddenSettings.of(validated(device="cuda")).gpus == 1
    sglang = HiddenSettings.of(
        validated(backend="sglang", sglang={"gpus": 4, "extra_args": ["--dtype", "x"]})
    )
    assert sglang.gpus == 4 and sglang.sglang.extra_args == ("--dtype", "x")


@pytest.mark.parametrize(
    ("choice", "output_of"),
    [
        (None, (1, 14, 26)),
        ({"convention": "input_of_layer", "ids": [3, 15, 27]}, (2, 14, 26)),
        ({"convention": "hf_hidden_states_index", "ids": [2, 15, 27]}, (1, 14, 26)),
        ({"convention": "output_of_layer", "ids": [2, 14, 26]}, (2, 14, 26)),
    ],
)
def test_the_aux_layers_of_a_target(choice, output_of):
    settings = HiddenSettings.of(validated(aux_layers=choice))
    if choice is not None:
        assert settings.aux_layers == AuxLayerChoice(choice["convention"], tuple(choice["ids"]))
    assert settings.aux(30) == AuxLayers.from_output_of(output_of, 30)


def test_aux_layers_the_target_lacks_are_refused_naming_the_key():
    settings = HiddenSettings.of(validated(aux_layers={"convention": "output_of_layer", "ids": [1, 14, 29]}))
    with pytest.raises(LayerIdError, match="extract.aux_layers: .*not capturable"):
        settings.aux(30)


@pytest.mark.parametrize(
    "choice",
    [{"convention": "input_of", "ids": [2, 15, 27]}, {"ids": [1, 14, 26]}, [1, 14, 26]],
)
def test_unreadable_aux_layers_are_refused_before_any_job(choice):
    with pytest.raises(ConfigError, match="extract.aux_layers"):
        validated(aux_layers=choice)
