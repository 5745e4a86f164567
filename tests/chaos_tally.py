"""The chaos suite's tally: cases tried and passed per class, and figures, kept per process.
Under pytest-xdist each worker hands its counts to the controller, which prints the sum."""

from __future__ import annotations

from collections import defaultdict

TALLY: dict[str, dict[str, int]] = defaultdict(lambda: {"tried": 0, "passed": 0})
FIGURES: dict[str, int] = defaultdict(int)


class Tally:
    def case(self, kind: str, passed: bool) -> None:
        TALLY[kind]["tried"] += 1
        TALLY[kind]["passed"] += int(passed)

    def add(self, figure: str, count: int = 1) -> None:
        FIGURES[figure] += count


def snapshot() -> dict:
    return {"tally": {k: dict(v) for k, v in TALLY.items()}, "figures": dict(FIGURES)}


def absorb(counts: dict) -> None:
    """Add a worker's snapshot to this process's counts."""
    for kind, case in counts["tally"].items():
        for field, n in case.items():
            TALLY[kind][field] += n
    for figure, n in counts["figures"].items():
        FIGURES[figure] += n


def summary_lines() -> list[str]:
    if not TALLY:
        return []
    lines = [f"{'class':<28}{'tried':>7}{'passed':>8}"]
    lines += [f"{kind:<28}{c['tried']:>7}{c['passed']:>8}" for kind, c in sorted(TALLY.items())]
    return lines + [f"{figure}: {count}" for figure, count in sorted(FIGURES.items())]
