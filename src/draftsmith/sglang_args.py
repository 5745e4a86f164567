"""SGLang launch arguments as SGLang's argparse reads them: flags, their values, and prefixes.

The launch commands and the refusals of generation, capture and the serving benchmark all
read arguments through here, so a spelling SGLang accepts cannot slip past one of them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


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
