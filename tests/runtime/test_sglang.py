"""SGLang launch arguments: flags with their values, and argparse's prefix rule; the launch
policy every launch shares (owned flags, refused flags with their reasons, the builder)."""

from __future__ import annotations

import pytest
from conftest import sglang_block

from draftsmith.runtime.sglang import (
    REFUSED,
    ServerLaunch,
    SGLangConfigError,
    abbreviates,
    canonical,
    flag_names,
    parse_flags,
)


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


BLOCK = sglang_block("generation")  # python3 on 127.0.0.1:30000, tp 1


def _launch(extra: list[str], *, speculative: bool = False) -> list[str]:
    block = {**BLOCK, "extra_args": extra}
    owned = {"--speculative-num-steps": "x.k"}
    return ServerLaunch.of(block, "x.sglang", owned, speculative=speculative).command("/m", ["--flag"])


def test_the_builder_puts_the_stage_flags_before_the_extra_args():
    assert _launch(["--dtype", "bfloat16"]) == [
        "python3", "-m", "sglang.launch_server", "--model-path", "/m",
        "--host", "127.0.0.1", "--port", "30000", "--tp-size", "1", "--flag", "--dtype", "bfloat16",
    ]  # fmt: skip


@pytest.mark.parametrize("speculative", [False, True])
@pytest.mark.parametrize("flag", sorted(REFUSED))
def test_every_refused_flag_is_refused_in_every_launch_with_its_reason(flag, speculative):
    with pytest.raises(SGLangConfigError, match="x.sglang.extra_args: --") as err:
        _launch([flag, "v"], speculative=speculative)
    if speculative or not flag.startswith("--speculative"):
        assert str(err.value).endswith(f"{flag} is refused: it {REFUSED[flag]}")
    else:  # the plain target refuses every speculative flag first
        assert "this launch runs the plain target" in str(err.value)


def test_a_stage_address_replaces_the_block_s_and_a_port_is_given_at_start():
    server = ServerLaunch.of({**BLOCK, "port": None, "extra_args": []}, "x.sglang", host="::1")
    assert server.at(5).url == "http://[::1]:5" and server.request_timeout_s is None
    assert server.at(5).command("/m")[5:9] == ["--host", "::1", "--port", "5"]


def test_owned_flags_name_what_to_configure_instead():
    with pytest.raises(SGLangConfigError, match="--port duplicates --port.*use x.sglang.port instead"):
        _launch(["--port", "1"])
    with pytest.raises(SGLangConfigError, match="duplicates --speculative-num-steps.*use x.k instead"):
        _launch(["--speculative-num-steps", "3"], speculative=True)


def test_a_speculative_launch_keeps_harmless_speculative_flags():
    assert _launch(["--speculative-attention-mode", "decode"], speculative=True)[-2:] == [
        "--speculative-attention-mode",
        "decode",
    ]
    with pytest.raises(SGLangConfigError, match="runs the plain target"):
        _launch(["--speculative-attention-mode", "decode"])
