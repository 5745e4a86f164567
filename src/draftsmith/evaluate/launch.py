"""The recommended SGLang launch: each measured setting's speculative flags and example
`sglang.launch_server` command line (placeholders for the target and the draft), and
benchmark.json's `recommended` setting.

The example serves one GPU (a target the evaluator holds in one process) at the context
the draft is exported for. It reads none of `serve_benchmark`: that stage may be off, and
the evaluation's key does not hold its settings, so a command built from them could show
settings the results were not built with."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, replace
from statistics import fmean

from draftsmith.evaluate.measure import section_key
from draftsmith.runtime.sglang import ServerLaunch, speculative_flags
from draftsmith.serve_bench import EAGLE3, check_launch
from draftsmith.speculation import Speculation

# The recommended command's placeholders, and what it shows of the server beyond the context.
TARGET_MODEL, DRAFT_DIR = "TARGET_MODEL", "DRAFT_DIR"
EXAMPLE_SERVER = ServerLaunch(python="python3", host="127.0.0.1", port=30000, tp_size=1)  # SGLang's defaults


@dataclass(frozen=True)
class Launch:
    """A setting's SGLang flags, its example launch command, and whether SGLang's parser read it."""

    flags: list[str]
    command: list[str]
    checked_by_sglang: bool


def sglang_launch(setting: Speculation, context_length: int) -> Launch:
    """The example server at `context_length` (`EvaluateSettings.launch_context`), with the
    draft at `setting` and placeholders for the target and the draft."""
    served = speculative_flags(setting, EAGLE3, f"${DRAFT_DIR}")
    server = replace(EXAMPLE_SERVER, context_length=context_length)
    cmd = server.command(f"${TARGET_MODEL}", served)
    return Launch(speculative_flags(setting, EAGLE3), cmd, check_launch(cmd, served))


def command_line(cmd: list[str]) -> str:
    """`cmd` for a POSIX shell, the placeholders left to expand."""
    placeholders = {f"${TARGET_MODEL}", f"${DRAFT_DIR}"}
    return " ".join(f'"{arg}"' if arg in placeholders else shlex.quote(arg) for arg in cmd)


def recommend(prompt_sets: dict, launches: dict[Speculation, Launch], placeholders: dict[str, str]) -> dict:
    """benchmark.json's `recommended`: of the settings in `launches`, the one with the highest
    mean of the per-prompt-set speed-ups (the first of equals)."""

    def mean_speedup(setting: Speculation) -> float:
        section, key = section_key(setting)
        return fmean(result[section][key]["speedup"] for result in prompt_sets.values())

    best = max(launches, key=mean_speedup)
    launch = launches[best]
    return {
        "setting": best.label,
        **best.as_json(),
        "mean_speedup": mean_speedup(best),
        "flags": launch.flags,
        "command": command_line(launch.command),
        "placeholders": placeholders,
        "checked_by_sglang": launch.checked_by_sglang,
    }
