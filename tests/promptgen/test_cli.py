"""`draftsmith promptgen GENERATOR ARGS...`: the generator's own arguments, help and exit code;
an unknown generator is a usage error."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from draftsmith import cli


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_styles_through_the_cli_exit_codes(tmp_path):
    refused = subprocess.run(
        [sys.executable, "-m", "draftsmith", "promptgen", "styles", "--out-dir", str(tmp_path)]
        + ["--style", "math", "--heldout-count", "100000"],
        capture_output=True,
        text=True,
    )
    assert refused.returncode == 1 and refused.stdout == ""
    assert "style math: only" in refused.stderr and "asked for 100000" in refused.stderr
    code = cli.main(
        ["promptgen", "styles", "--out-dir", str(tmp_path), "--style", "chat"]
        + ["--train-count", "20", "--heldout-count", "3"]
    )
    assert code == 0
    assert [len(read(tmp_path / f"chat-{part}.jsonl")) for part in ("train", "heldout")] == [20, 3]


@pytest.mark.parametrize("generator", ["docstrings", "styles", "long-context"])
def test_a_generator_s_help_is_its_own(generator, capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["promptgen", generator, "--help"])
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: draftsmith promptgen {generator} [-h] --")


def test_an_unknown_generator_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as refused:
        cli.main(["promptgen", "nosuch"])
    assert refused.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: draftsmith promptgen")
    assert "invalid choice: 'nosuch' (choose from 'docstrings', 'styles', 'long-context')" in err
