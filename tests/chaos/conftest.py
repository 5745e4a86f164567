"""The chaos suite's tally: cases tried and passed per class, printed after the run."""

from __future__ import annotations

from collections import defaultdict

import pytest

TALLY: dict[str, dict[str, int]] = defaultdict(lambda: {"tried": 0, "passed": 0})
FIGURES: dict[str, int] = defaultdict(int)


class Tally:
    def case(self, kind: str, passed: bool) -> None:
        TALLY[kind]["tried"] += 1
        TALLY[kind]["passed"] += int(passed)

    def add(self, figure: str, count: int = 1) -> None:
        FIGURES[figure] += count


@pytest.fixture(scope="session")
def tally() -> Tally:
    return Tally()


def pytest_terminal_summary(terminalreporter) -> None:
    if not TALLY:
        return
    write = terminalreporter.write_line
    terminalreporter.section("chaos summary")
    write(f"{'class':<28}{'tried':>7}{'passed':>8}")
    for kind, counts in sorted(TALLY.items()):
        write(f"{kind:<28}{counts['tried']:>7}{counts['passed']:>8}")
    for figure, count in sorted(FIGURES.items()):
        write(f"{figure}: {count}")
