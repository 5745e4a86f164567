"""SGLang launch commands for the serving benchmark, and the refusals that keep its numbers true.

Facts from sglang 0.5.23 (python/sglang/srt/arg_groups/fields/spec.py and
arg_groups/speculative_hook.py, _handle_eagle_family), rechecked in 0.5.16 (the H200
machine's; server_args.py:1715-1856 and arg_groups/speculative_hook.py) and 0.5.21 (the
parser CI installs, requirements/sglang-parser.txt; arg_groups/fields/spec.py):

- A chain of k draft tokens is `--speculative-algorithm EAGLE3 --speculative-num-steps k
  --speculative-eagle-topk 1 --speculative-num-draft-tokens k+1`; a config asking for
  another num_draft_tokens is refused (`draftsmith.speculation`).
- EAGLE instead of EAGLE3 gives an EAGLE-3 draft the single last-layer state (H) instead
  of the three aux layers (3H), without an error (is_eagle() vs is_eagle3()).
- Extra args in `runtime.sglang.REFUSED` change what is measured without an error (random
  draft weights, a foreign vocabulary map, lossy acceptance, a k that moves at run time, a
  draft attending to a window only or keeping its KV cache in another dtype, another
  verification); every launch refuses them, each with its reason.
- Without a quantization of its own the draft gets the target's `--quantization`, so draft
  servers set `--speculative-draft-model-quantization unquant` (`draft_flags`).
- SGLANG_SIMULATE_ACC_LEN in the server's environment makes SGLang fake the acceptance
  length (speculative/spec_utils.py: "turn off if < 0"), so a run with it set is refused.

The refusals of the config alone run once, as the stage's settings are built
(`settings.ServeBenchSettings.of`); the job checks what only it sees: the exported draft's
config.json (`check_draft`), the target's context (`serving_context`) and its environment.
`check_launch` has SGLang's own argument parser read a launch (the evaluator's recommended
one too, a chain or a tree) where SGLang is importable.
`draft_command` serves any setting, chain or tree: the configured chains and the settings
search's best settings.
"""

from __future__ import annotations

import argparse
import json
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path

from draftsmith.errors import ConfigError
from draftsmith.export import SGLANG_ARCHITECTURE
from draftsmith.runtime.sglang import (
    DRAFT_QUANTIZATION,
    UNQUANTIZED,
    ServerLaunch,
    SGLangConfigError,
    flag_names,
    owned_flags,
    parse_flags,
    speculative_flags,
)
from draftsmith.speculation import Speculation
from draftsmith.store.layout import EXPORT_FILES

SECTION = "serve_benchmark"
SGLANG_SECTION = f"{SECTION}.sglang"
EAGLE3 = "EAGLE3"
# The benchmark's servers answer on loopback only: they have no API key.
HOST = "127.0.0.1"
SIMULATE_ACCEPTANCE_ENV = "SGLANG_SIMULATE_ACC_LEN"

# Flags the builder sets beyond `ServerLaunch.base_command`'s, mapped to what to configure instead.
_OWNED = {
    "--speculative-algorithm": f"{SECTION}.speculative_algorithm",
    "--speculative-draft-model-path": "nothing (the benchmark serves the export's sglang/ directory)",
    "--speculative-draft-model": "nothing (the benchmark serves the export's sglang/ directory)",
    "--speculative-num-steps": f"{SECTION}.k",
    "--speculative-eagle-topk": f"{SECTION}.eagle_topk",
    "--speculative-num-draft-tokens": f"{SECTION}.num_draft_tokens",
    "--host": f"nothing (the benchmark serves on {HOST})",
    DRAFT_QUANTIZATION: f"nothing (draft servers run the draft as exported: {UNQUANTIZED})",
}


class ServeBenchError(ConfigError):
    """A benchmark that would measure something other than it says, or an answer that does not fit."""


def serving_server(section: dict) -> ServerLaunch:
    """`serve_benchmark.sglang`: the benchmark's servers, on `HOST`, their extra args refused
    where they repeat a flag the builder sets or would falsify the measurement."""
    try:
        return ServerLaunch.of(section, SGLANG_SECTION, _OWNED, speculative=True, host=HOST)
    except SGLangConfigError as exc:
        raise ServeBenchError(str(exc)) from None


def draft_command(
    model_dir: str | Path,
    server: ServerLaunch,
    port: int,
    draft_dir: str | Path,
    setting: Speculation,
    algorithm: str,
) -> list[str]:
    """The `sglang.launch_server` command of the target with the draft at `setting`."""
    return launch_command(model_dir, server, port, speculative_flags(setting, algorithm, draft_dir))


def launch_command(
    model_dir: str | Path, server: ServerLaunch, port: int, speculative: Sequence[str] = ()
) -> list[str]:
    """`server` at `port` for `model_dir`, the `speculative` flags (`speculative_flags`), then
    the extra args (`serving_server` refused those that would change what is served)."""
    return server.at(port).command(model_dir, speculative)


def check_launch(cmd: list[str], checked: Sequence[str]) -> bool:
    """Check that SGLang reads the flags and values of `checked` (a part of `cmd`) as given.

    Where SGLang is importable its own parser reads the whole of `cmd` (True); elsewhere the
    flags of `checked` must be ones this module knows SGLang by (False: SGLang did not check).
    """
    try:
        from sglang.srt.server_args import ServerArgs
    except ImportError:
        known = [*owned_flags(SGLANG_SECTION), *_OWNED]
        unknown = [flag for flag in flag_names(checked) if flag not in known]
        if unknown:
            raise ServeBenchError(f"{unknown}: not SGLang launch flags draftsmith knows") from None
        return False
    parser = argparse.ArgumentParser(prog="sglang.launch_server")
    ServerArgs.add_cli_args(parser)
    try:
        args = parser.parse_args(cmd[3:])  # after `python -m sglang.launch_server`
    except SystemExit:
        raise ServeBenchError(f"SGLang's argument parser refuses {shlex.join(cmd)}") from None
    for flag, values in parse_flags(checked):
        read = getattr(args, flag.removeprefix("--").replace("-", "_"), None)
        if [str(read)] != values:
            raise ServeBenchError(f"SGLang reads {flag} {' '.join(values)} as {read!r}")
    return True


# --- refusals ------------------------------------------------------------------------------
def check_architectures(architectures: list[str]) -> None:
    """Refuse a draft whose config.json names another model than the EAGLE-3 draft draftsmith exports."""
    if SGLANG_ARCHITECTURE not in architectures:
        raise ServeBenchError(
            f"the draft's config.json names architectures {architectures}, not "
            f"{SGLANG_ARCHITECTURE}: not an EAGLE-3 draft as draftsmith exports them"
        )


def check_draft(draft_dir: Path, serving_context: int) -> dict:
    """Refuse a draft directory SGLang would serve wrongly; returns its config.json."""

    path = Path(draft_dir) / EXPORT_FILES["config"]
    try:
        draft_config = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ServeBenchError(f"{path}: cannot read the draft's config: {exc}") from None
    check_architectures(list(draft_config.get("architectures") or []))
    positions = draft_config.get("max_position_embeddings")
    if not isinstance(positions, int) or positions < serving_context:
        raise ServeBenchError(
            f"{path}: max_position_embeddings {positions!r} is below the serving context "
            f"{serving_context} ({SGLANG_SECTION}.context_length, or the target's own): the draft "
            "loses acceptance past its positions"
        )
    return draft_config


def serving_context(server: ServerLaunch, target_config: dict) -> int:
    """The context SGLang serves: the configured one, else the target's max_position_embeddings."""
    if server.context_length is not None:
        return server.context_length
    positions = target_config.get("max_position_embeddings")
    if not isinstance(positions, int):
        raise ServeBenchError(
            f"the target's config.json gives no max_position_embeddings; set {SGLANG_SECTION}.context_length"
        )
    return positions


def check_environment(env: Mapping[str, str]) -> None:
    if SIMULATE_ACCEPTANCE_ENV in env:
        raise ServeBenchError(
            f"{SIMULATE_ACCEPTANCE_ENV}={env[SIMULATE_ACCEPTANCE_ENV]} is set: SGLang would simulate "
            "the acceptance length instead of measuring the draft; unset it"
        )
