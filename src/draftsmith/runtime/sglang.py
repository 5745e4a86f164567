"""SGLang launch policy: arguments as SGLang's argparse reads them (flags, values, prefixes),
a server's launch settings (`ServerLaunch`: its base command, extra args and URL), the flags
draftsmith owns, the extra args refused in every launch (`REFUSED`, each with its reason),
and a speculative setting's flags (and those loading the draft).

Generation, capture and the serving benchmark all build their launches here, so a flag
refused in one is refused in all, in any spelling SGLang accepts.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
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


@dataclass(frozen=True)
class ServerLaunch:
    """How one SGLang server starts (a config's `sglang` block): its extra args were refused,
    where they had to be, when `of` built it."""

    python: str
    host: str
    port: int | None  # None: a free loopback port, picked when the job starts (`at`)
    tp_size: int
    mem_fraction_static: float | None = None
    context_length: int | None = None  # None: the target's own
    extra_args: tuple[str, ...] = ()
    startup_timeout_s: float | None = None  # None: a launch shown, not one a job starts
    request_timeout_s: float | None = None  # None: the stage sets none per request

    @classmethod
    def of(
        cls,
        block: dict,
        section: str,
        owned: dict[str, str] | None = None,
        *,
        speculative: bool = False,
        host: str | None = None,
    ) -> ServerLaunch:
        """The config block at `section` (`host`: the stage's own address instead of the
        block's), its extra args refused as `check_extra_args` says."""
        extra = tuple(str(arg) for arg in block["extra_args"])
        check_extra_args(list(extra), section, owned or {}, speculative=speculative)
        return cls(
            python=block["python"],
            host=host or block["host"],
            port=block["port"],
            tp_size=block["tp_size"],
            mem_fraction_static=block["mem_fraction_static"],
            context_length=block["context_length"],
            extra_args=extra,
            startup_timeout_s=block["startup_timeout_s"],
            request_timeout_s=block.get("request_timeout_s"),
        )

    def at(self, port: int) -> ServerLaunch:
        return replace(self, port=port)

    def base_command(self, model_dir: str | Path) -> list[str]:
        """Model, address, parallelism and memory flags; no extra args."""
        cmd = [self.python, "-m", "sglang.launch_server", "--model-path", str(model_dir)]
        cmd += ["--host", self.host, "--port", str(self.port), "--tp-size", str(self.tp_size)]
        if self.mem_fraction_static is not None:
            cmd += ["--mem-fraction-static", str(self.mem_fraction_static)]
        if self.context_length is not None:
            cmd += ["--context-length", str(self.context_length)]
        return cmd

    def command(self, model_dir: str | Path, flags: Sequence[str] = ()) -> list[str]:
        """The `sglang.launch_server` command: the base command, the stage's own `flags`, then
        the extra args."""
        return [*self.base_command(model_dir), *flags, *self.extra_args]

    @property
    def url(self) -> str:
        """Base URL to reach the server from this machine."""
        host = "127.0.0.1" if self.host in _WILDCARD_HOSTS else self.host
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port}"


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
    """Flags `ServerLaunch.base_command` sets, mapped to what to configure in `section` instead."""
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


# Why each refused extra arg is refused, in every launch draftsmith makes (generation, capture,
# serving): each changes what the server computes without an error, so a run would report
# (or store) something other than it says. Flags SGLang added later are refused too (the draft
# KV dtype and the sink since 0.5.20 and 0.5.21, block verification since 0.5.23), as is
# 0.5.16's older spelling of the window.
_LOSSY = "accepts draft tokens the target would not choose: AL rises and the output is not the target's"
_MOVING_K = "changes the number of draft steps at run time, so the result would not belong to its k"
_WINDOW = "limits the draft's attention to recent positions, short of the context it was exported for"
_VERIFY = "replaces greedy verification, which the benchmark measures"
_SECRET = "puts a secret in the config, and draftsmith's requests carry no key"
REFUSED = {
    "--config": "reads a config file, which could set any of these flags unseen",
    # Secrets come from the environment, never from a config; draftsmith's servers need none.
    "--api-key": _SECRET,
    "--admin-api-key": _SECRET,
    "--speculative-draft-load-format": "can load random draft weights (dummy): acceptance ~1 and no error",
    "--speculative-token-map": "replaces the draft's own vocabulary map (d2t) with another table",
    "--speculative-accept-threshold-single": _LOSSY,
    "--speculative-accept-threshold-acc": _LOSSY,
    "--speculative-adaptive": _MOVING_K,
    "--speculative-adaptive-config": _MOVING_K,
    "--enable-multi-layer-eagle": "runs a multi-layer EAGLE draft; the export has one layer",
    "--speculative-draft-window-size": _WINDOW,
    "--speculative-dflash-draft-window-size": _WINDOW,  # 0.5.16's older spelling
    "--speculative-draft-sink-size": _WINDOW,
    "--speculative-draft-kv-cache-dtype": "gives the draft's KV cache a dtype of its own (fp8: less precise)",
    # Under it 0.5.16 samples the proposals of greedy requests too (they run at temperature 1,
    # top-k 1; speculative/spec_utils.py, sample_draft_proposal); 0.5.21 takes their top token.
    "--speculative-use-rejection-sampling": f"{_VERIFY} (0.5.16 then samples the draft's proposals)",
    "--speculative-use-block-verification": f"{_VERIFY} (and turns rejection sampling on)",
}
SPECULATIVE = "--speculative"  # every flag of speculative decoding starts so
_LOAD_FORMAT, _RANDOM_WEIGHTS = "--load-format", "dummy"


def refused_reason(flag: str) -> str | None:
    """Why `flag` (in any spelling SGLang accepts) is refused in every launch; None: it is not."""
    refused = next((name for name in REFUSED if abbreviates(flag, name)), None)
    return REFUSED[refused] if refused else None


def check_extra_args(extra: list[str], section: str, owned: dict[str, str], *, speculative: bool) -> None:
    """Refuse extra args that repeat a flag the builder sets (`owned_flags(section)` and `owned`),
    that `REFUSED` names, that load random weights, or (unless the launch is `speculative`) that
    touch speculative decoding at all: such a launch runs the plain target."""
    for flag in flag_names(extra):
        if not speculative and flag.startswith(SPECULATIVE):
            raise SGLangConfigError(
                f"{section}.extra_args: {flag} is refused: this launch runs the plain target, and "
                "draftsmith sets the speculative flags where it speculates"
            )
    check_owned_flags(extra, owned_flags(section) | owned, section)
    for flag, values in parse_flags(extra):
        if abbreviates(flag, _LOAD_FORMAT) and values[:1] == [_RANDOM_WEIGHTS]:
            raise SGLangConfigError(
                f"{section}.extra_args: {flag} {_RANDOM_WEIGHTS} loads random weights (for the draft "
                "too): the server would compute noise"
            )
        reason = refused_reason(flag)
        if reason:
            raise SGLangConfigError(f"{section}.extra_args: {flag} is refused: it {reason}")
