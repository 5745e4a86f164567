"""The chaos suite's tally fixture (tests/chaos_tally.py; the root conftest prints it)."""

from __future__ import annotations

import pytest
from chaos_tally import Tally


@pytest.fixture(scope="session")
def tally() -> Tally:
    return Tally()
