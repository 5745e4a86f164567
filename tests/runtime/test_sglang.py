"""SGLang launch arguments: flags with their values, and argparse's prefix rule."""

from __future__ import annotations

from draftsmith.runtime.sglang import abbreviates, canonical, flag_names, parse_flags


def test_values_follow_their_flag_up_to_the_next_flag():
    args = ["python3", "-m", "--ids", "1", "14", "--chunked-prefill-size", "-1", "--disable-radix-cache"]
    assert parse_flags(args) == [  # args before the first flag belong to no flag
        ("--ids", ["1", "14"]),
        ("--chunked-prefill-size", ["-1"]),  # only `--` starts a flag
        ("--disable-radix-cache", []),
    ]


def test_equals_gives_a_value_and_repeats_are_kept():
    args = ["--dtype=bfloat16", "--port=", "--dtype", "float16"]
    assert parse_flags(args) == [("--dtype", ["bfloat16"]), ("--port", [""]), ("--dtype", ["float16"])]
    assert flag_names(args) == ["--dtype", "--port", "--dtype"]


def test_prefixes_longer_than_dashes_abbreviate():
    assert abbreviates("--tp", "--tp-size")
    assert abbreviates("--tp-size", "--tp-size")
    assert not abbreviates("--", "--tp-size")
    assert not abbreviates("--tp-sizes", "--tp-size")


def test_canonical_resolves_only_what_argparse_would():
    known = ("--disable-radix-cache", "--speculative-algorithm", "--speculative-draft-model-path")
    assert canonical("--disable-radix", known) == "--disable-radix-cache"
    assert canonical("--speculative", known) == "--speculative"  # ambiguous: left as given
    assert canonical("--dtype", known) == "--dtype"
    assert canonical("--", known) == "--"
    # An exact match wins over the longer flag it is also a prefix of.
    assert canonical("--model", ("--model-path", "--model")) == "--model"
