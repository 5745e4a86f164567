"""A speculative setting: its names, its check, the chain rule."""

import pytest

from draftsmith.speculation import BASELINE, Speculation, max_draft_tokens


def test_a_chain_and_a_tree_are_named_alike_in_every_report_and_file_name():
    chain, tree = Speculation.chain(3), Speculation(3, 2, 6)
    assert chain == Speculation(3, 1, 4) and chain.is_chain and not tree.is_chain
    assert (chain.label, chain.slug) == ("k=3", "k3")
    assert (tree.label, tree.slug, tree.shape) == ("tree 3/2/6", "tree3-2-6", "3/2/6")
    assert BASELINE == "baseline"


def test_a_setting_reads_back_from_its_json():
    row = {"setting": "tree 3/2/6", "num_steps": 3, "topk": 2, "num_draft_tokens": 6, "speedup": 1.4}
    assert Speculation.of(row) == Speculation(3, 2, 6)
    assert Speculation.of(Speculation(3, 2, 6).as_json()) == Speculation(3, 2, 6)


def test_valid_settings_pass_the_check():
    for setting in (Speculation.chain(1), Speculation.chain(7), Speculation(2, 2, 7), Speculation(3, 2, 2)):
        setting.check()
    assert max_draft_tokens(2, 2) == 7


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        (Speculation(3, 1, 5), r"topk 1 is a chain, which SGLang runs with num_draft_tokens = num_steps \+ 1 "
                               r"\(4\), not 5"),
        (Speculation(3, 1, 3), r"topk 1 is a chain.* \(4\), not 3"),
        (Speculation(2, 2, 8), r"num_draft_tokens must be between 2 and 7"),
        (Speculation(2, 2, 1), r"num_draft_tokens must be between 2 and 7"),
        (Speculation(0, 2, 4), r"num_steps must be >= 1"),
        (Speculation(2, 0, 4), r"topk must be >= 1"),
    ],
)  # fmt: skip
def test_the_check_refuses_what_cannot_be_built_or_what_sglang_would_change(setting, message):
    with pytest.raises(ValueError, match=message):
        setting.check()
