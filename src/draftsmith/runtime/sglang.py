"""SGLang launches: arguments as SGLang's argparse reads them (flags, values, prefixes), the
base launch command, the flags it owns, a speculative setting's flags (and those loading the
draft), and the server's URL.

The launch commands and the refusals of generation, capture and the serving benchmark all
read arguments through here, so a spelling SGLang accepts cannot slip past one of them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from draftsmith.errors import ConfigError
from draftsmith.speculation import Speculation


def parse_flags(args: Sequence[str]) -> list[tuple[str, list[str]]]:
    """(flag, values) for each flag in `args`, in order; args before the first flag are skipped.

    The values are the `=value` of `--flag=value`, then every following arg up to the next
    flag: only `--` starts a flag, so `-1` is a value.
    """
    flags: list[tuple[str, list[str]]] = []
    for arg in args:
        if arg.startswith("--"):
            name, eq, value = arg.partition("=")
            flags.append((name, [value] if eq else []))
        elif flags:
            flags[-1][1].append(arg)
    return flags


def flag_names(args: Sequence[str]) -> list[str]:
    """The flags in `args`, as given (`--x=1` gives `--x`)."""
    return [name for name, _ in parse_flags(args)]


def abbreviates(flag: str, full: str) -> bool:
    """Whether `flag` can stand for `full`: argparse accepts prefixes longer than `--`."""
    return len(flag) > 2 and full.startswith(flag)


def canonical(flag: str, known: Iterable[str]) -> str:
    """The flag of `known` SGLang reads `flag` as; `flag` itself when none or several could be meant."""
    known = tuple(known)
    if flag in known:
        return flag  # argparse takes an exact match before looking at prefixes
    matches = [full for full in known if abbreviates(flag, full)]
    return matches[0] if len(matches) == 1 else flag


# Flags the base command sets, with their SGLang aliases, mapped to the key (in the
# config section that holds the sglang settings) to use instead.
_OWNED_KEYS = {
    "--host": "host",
    "--port": "port",
    "--tp-size": "tp_size",
    "--tensor-parallel-size": "tp_size",
    "--mem-fraction-static": "mem_fraction_static",
    "--context-length": "context_length",
}
_MODEL_FLAGS = ("--model-path", "--model")
DRAFT_QUANTIZATION = "--speculative-draft-model-quantization"
UNQUANTIZED = "unquant"
_WILDCARD_HOSTS = ("", "0.0.0.0", "::")


class SGLangConfigError(ConfigError):
    """An sglang config section asks for a launch the builder cannot make."""


def base_launch_command(model_dir: str, sglang_cfg: dict) -> list[str]:
    """Model, address, parallelism and memory flags from an sglang config block; no extra args."""
    cmd = [sglang_cfg["python"], "-m", "sglang.launch_server", "--model-path", model_dir]
    cmd += ["--host", sglang_cfg["host"], "--port", str(sglang_cfg["port"])]
    cmd += ["--tp-size", str(sglang_cfg["tp_size"])]
    if sglang_cfg.get("mem_fraction_static") is not None:
        cmd += ["--mem-fraction-static", str(sglang_cfg["mem_fraction_static"])]
    if sglang_cfg.get("context_length") is not None:
        cmd += ["--context-length", str(sglang_cfg["context_length"])]
    return cmd


def speculative_flags(setting: Speculation, algorithm: str, draft_dir: str | Path | None = None) -> list[str]:
    """The launch flags of `setting`; with `draft_dir`, those that load the draft from it."""
    draft = [] if draft_dir is None else draft_flags(draft_dir)
    return [
        "--speculative-algorithm", algorithm, *draft,
        "--speculative-num-steps", str(setting.num_steps),
        "--speculative-eagle-topk", str(setting.topk),
        "--speculative-num-draft-tokens", str(setting.num_draft_tokens),
    ]  # fmt: skip


def draft_flags(draft_dir: str | Path) -> list[str]:
    """The draft's path, and `unquant` so that it runs as exported: without a quantization of its
    own SGLang quantizes the draft as the target's `--quantization` says (sglang 0.5.16
    server_args.py:3412, 0.5.21 arg_groups/serving_hook.py:628); `unquant` leaves it to the
    draft's config.json, which has no quantization."""
    return ["--speculative-draft-model-path", str(draft_dir), DRAFT_QUANTIZATION, UNQUANTIZED]


def owned_flags(section: str) -> dict[str, str]:
    """Flags `base_launch_command` sets, mapped to what to configure in `section` instead."""
    owned = dict.fromkeys(_MODEL_FLAGS, "the target model")
    return owned | {flag: f"{section}.{key}" for flag, key in _OWNED_KEYS.items()}


def check_owned_flags(extra: list[str], owned: dict[str, str], section: str) -> None:
    """Refuse extra args that repeat a flag the builder sets, in any spelling SGLang accepts."""
    for flag in flag_names(extra):
        # `--tp` means `--tp-size`; a prefix of several is refused too (SGLang finds it ambiguous).
        matches = [known for known in owned if abbreviates(flag, known)]
        if matches:
            known = flag if flag in owned else matches[0]  # argparse takes an exact match first
            raise SGLangConfigError(
                f"{section}.extra_args: {flag} duplicates {known}, which draftsmith "
                f"sets itself; use {owned[known]} instead"
            )


def server_url(sglang_cfg: dict) -> str:
    """Base URL to reach the server from this machine."""
    host = sglang_cfg["host"]
    host = "127.0.0.1" if host in _WILDCARD_HOSTS else host
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{sglang_cfg['port']}"
