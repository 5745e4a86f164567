"""The model stage's record as later stages read it."""

from __future__ import annotations

import json
import os

import pytest

from draftsmith.errors import ModelError
from draftsmith.target.load import model_info


def test_a_converted_target_is_found_from_any_working_directory(tmp_path, monkeypatch):
    store = tmp_path / "store" / "model" / "0123456789abcdef"
    (store / "hf").mkdir(parents=True)
    (store / "model.json").write_text(json.dumps({"hf_dir": "hf", "vocab_size": 8}))
    elsewhere = tmp_path / "another checkout"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    info = model_info(os.path.relpath(store / "model.json"))
    assert os.path.samefile(info["hf_dir"], store / "hf") and info["vocab_size"] == 8


def test_a_target_used_in_place_keeps_its_absolute_path(tmp_path):
    target = tmp_path / "weights"
    target.mkdir()
    (tmp_path / "model.json").write_text(json.dumps({"hf_dir": str(target)}))
    assert model_info(tmp_path / "model.json")["hf_dir"] == str(target)


def test_a_missing_directory_says_how_to_rebuild(tmp_path):
    (tmp_path / "model.json").write_text(json.dumps({"hf_dir": "hf"}))
    with pytest.raises(ModelError, match="delete .* to rebuild the model stage"):
        model_info(tmp_path / "model.json")
