"""draftsmith.target.special_tokens on the real demo tokenizer and model (SmolLM2-135M-Instruct, ChatML).

`<|im_end|>` is id 2 there, and also the eos. The failure this module exists for: a
vocabulary holding an ordinary token that reads like `<|im_end|>` (163533 vs 163586
in a real run), and code that used the wrong one.
"""

from __future__ import annotations

import copy
import logging

import pytest

from draftsmith.errors import ModelError
from draftsmith.model.stage import describe
from draftsmith.target import load as target
from draftsmith.target import special_tokens

IM_END = 2
IM_START = 1
ENDOFTEXT = 0


@pytest.fixture(scope="module")
def tokenizer(demo_model_dir):
    return target.load_tokenizer(demo_model_dir)


@pytest.fixture(scope="module")
def model(demo_model_dir):
    """The one model load of this module."""
    return target.load_model(demo_model_dir, "float32")


@pytest.fixture()
def lookalike_tokenizer(tokenizer):
    """A copy of the real tokenizer plus an ordinary token that reads '<|im_end|>' once stripped."""
    copied = copy.deepcopy(tokenizer)
    assert copied.add_tokens([" <|im_end|>"]) == 1
    new_id = len(copied) - 1
    assert copied.convert_ids_to_tokens(new_id) == " <|im_end|>"
    assert copied.decode([new_id]).strip() == "<|im_end|>"
    assert new_id not in copied.all_special_ids
    return copied, new_id


def test_template_end_of_turn_is_im_end(tokenizer):
    eot = special_tokens.template_end_of_turn(tokenizer)
    assert eot["ids"] == [IM_END]
    assert eot["text"] == "<|im_end|>"
    assert eot["suffix"] == "<|im_end|>\n"
    assert eot["generation_prompt_tail"] == "<|im_start|>assistant\n"
    assert eot["generation_prompt_tail_ids"][0] == IM_START
    assert tokenizer.decode(eot["generation_prompt_tail_ids"]) == "<|im_start|>assistant\n"
    # The template's own generation prompt really ends with those ids.
    prompt_ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert prompt_ids[-len(eot["generation_prompt_tail_ids"]) :] == eot["generation_prompt_tail_ids"]


def test_end_of_turn_found_when_only_flagged_special(tokenizer):
    """transformers 5.17 loads the GGUF tokenizer with `<|im_end|>` flagged special among
    the added tokens but absent from `all_special_tokens` (eos and pad `<|endoftext|>`)."""
    copied = copy.deepcopy(tokenizer)
    copied.eos_token = copied.pad_token = "<|endoftext|>"
    assert IM_END not in copied.all_special_ids and copied.added_tokens_decoder[IM_END].special
    assert special_tokens.special_vocab(copied)["<|im_end|>"] == IM_END
    assert special_tokens.template_end_of_turn(copied)["ids"] == [IM_END]


def test_single_id_check_passes_on_real_tokenizer(tokenizer):
    assert special_tokens.single_id_check(tokenizer) == {}
    for token in tokenizer.all_special_tokens:
        assert len(tokenizer(token, add_special_tokens=False)["input_ids"]) == 1


def test_real_tokenizer_has_no_lookalikes(tokenizer):
    assert special_tokens.lookalikes(tokenizer, [IM_END]) == {str(IM_END): []}


def test_inspect_with_model_records_emitted_end_of_turn(tokenizer, model, caplog):
    with caplog.at_level(logging.WARNING, logger="draftsmith.target.special_tokens"):
        report = special_tokens.inspect(tokenizer, IM_END, [IM_END], model)
    assert report["emitted_end_of_turn_id"] == IM_END
    assert report["end_of_turn"]["ids"] == [IM_END]
    assert report["generation_config_eos_ids"] == [IM_END]
    assert report["lookalikes"] == {str(IM_END): []}
    assert report["multi_id_special_tokens"] == {}
    assert report["special_tokens"]["<|im_end|>"] == IM_END
    assert report["special_tokens"]["<|im_start|>"] == IM_START
    assert report["eos_token_id"] == IM_END
    assert not [r for r in caplog.records if r.name == "draftsmith.target.special_tokens"]


def test_probe_emitted_is_the_models_real_stop_id(tokenizer, model):
    # Offered several stop ids, the model really ends its reply with <|im_end|>.
    assert special_tokens.probe_emitted(model, tokenizer, [IM_END, ENDOFTEXT]) == IM_END
    # Without <|im_end|> among the stop ids it does not stop on it within 4 tokens.
    assert special_tokens.probe_emitted(model, tokenizer, [ENDOFTEXT], max_new_tokens=4) is None


def test_inspect_without_configured_ids_passes(tokenizer):
    report = special_tokens.inspect(tokenizer, [IM_END], None)
    assert report["end_of_turn"]["ids"] == [IM_END]
    assert report["emitted_end_of_turn_id"] is None


@pytest.mark.parametrize("configured", [[ENDOFTEXT], [IM_START], [IM_END, IM_END], [163533]])
def test_configured_ids_that_differ_from_the_template_raise(tokenizer, configured):
    with pytest.raises(ModelError) as err:
        special_tokens.inspect(tokenizer, IM_END, configured)
    message = str(err.value)
    assert str(configured) in message
    assert str([IM_END]) in message
    assert "'<|im_end|>'" in message


def test_configured_lookalike_id_raises_naming_both(lookalike_tokenizer):
    tok, lookalike = lookalike_tokenizer
    with pytest.raises(ModelError) as err:
        special_tokens.inspect(tok, IM_END, [lookalike])
    message = str(err.value)
    assert f"[{lookalike}]" in message
    assert f"[{IM_END}]" in message
    # The error also lists the ids that read the same, so the user sees the trap.
    assert f"{{'{IM_END}': [{lookalike}]}}" in message


def test_lookalike_is_listed_and_warned(lookalike_tokenizer, caplog):
    tok, lookalike = lookalike_tokenizer
    # The template still ends a turn with the real special token, not the look-alike.
    assert special_tokens.template_end_of_turn(tok)["ids"] == [IM_END]
    assert special_tokens.lookalikes(tok, [IM_END]) == {str(IM_END): [lookalike]}
    with caplog.at_level(logging.WARNING, logger="draftsmith.target.special_tokens"):
        report = special_tokens.inspect(tok, IM_END, [IM_END])
    assert report["lookalikes"] == {str(IM_END): [lookalike]}
    warnings = [r for r in caplog.records if r.name == "draftsmith.target.special_tokens"]
    assert len(warnings) == 1
    assert warnings[0].levelno == logging.WARNING
    assert str(lookalike) in warnings[0].getMessage()
    assert str(IM_END) in warnings[0].getMessage()


@pytest.mark.parametrize("stop_ids", [ENDOFTEXT, [ENDOFTEXT], [ENDOFTEXT, IM_START]])
def test_generation_stop_ids_without_end_of_turn_raise(tokenizer, stop_ids):
    with pytest.raises(ModelError, match="run past the end of the reply") as err:
        special_tokens.inspect(tokenizer, stop_ids, [IM_END])
    assert str([IM_END]) in str(err.value)


def test_generation_stop_ids_including_end_of_turn_pass(tokenizer):
    report = special_tokens.inspect(tokenizer, [ENDOFTEXT, IM_END], [IM_END])
    assert report["generation_config_eos_ids"] == [ENDOFTEXT, IM_END]


def test_describe_model_records_the_template_end_of_turn(demo_model_dir):
    info = describe(demo_model_dir, dtype="float32", trust_remote_code=False, probe_generation=False)
    tokens = info["special_tokens"]
    assert tokens["end_of_turn"]["ids"] == [IM_END]
    assert tokens["generation_config_eos_ids"] == [IM_END]
    assert info["num_hidden_layers"] == 30
    assert info["hidden_size"] == 576
    assert info["vocab_size"] == 49152
    with pytest.raises(ModelError, match=r"\[163533\]"):
        describe(
            demo_model_dir,
            dtype="float32",
            trust_remote_code=False,
            probe_generation=False,
            end_of_turn_ids=(163533,),
        )
