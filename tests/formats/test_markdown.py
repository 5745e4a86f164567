"""Numbers as the reports print them."""

from __future__ import annotations

from draftsmith.formats.markdown import human_size


def test_human_size():
    assert [human_size(n) for n in (0, 999, 1000, 1_234_567, 5 * 10**15)] == [
        "0 B",
        "999 B",
        "1.0 kB",
        "1.2 MB",
        "5.0 PB",
    ]
