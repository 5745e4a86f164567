"""The export names load without torch: code that only needs them (config checks, the
serve bench's launch check) must not pay for it."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize("module", ["draftsmith.export.names", "draftsmith.export"])
def test_importing_the_names_does_not_import_torch(module):
    subprocess.run(
        [sys.executable, "-c", f"import sys, {module}; assert 'torch' not in sys.modules"], check=True
    )


def test_the_package_still_offers_the_loader():
    from draftsmith.export import load_sglang_export
    from draftsmith.export.load import load_sglang_export as loader

    assert load_sglang_export is loader
