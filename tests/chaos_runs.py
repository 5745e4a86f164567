"""What the chaos suites (tests/chaos) share: the seed and running the real workflow."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml
from conftest import snakemake_cmd

# Seeded: DRAFTSMITH_CHAOS_SEED (default 15) picks delays, kill kinds and damage.
SEED = int(os.environ.get("DRAFTSMITH_CHAOS_SEED", "15"))


def run(
    work: Path, config_path: Path, *args: str, check: bool = True, env=None
) -> subprocess.CompletedProcess:
    command = snakemake_cmd(work, config_path, *args)
    result = subprocess.run(command, capture_output=True, text=True, timeout=900, env=env)
    if check and result.returncode != 0:
        raise AssertionError(result.stdout[-3000:] + result.stderr[-3000:])
    return result


def draftsmith(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "draftsmith", *args], capture_output=True, text=True)


def write(config: dict, path: Path) -> Path:
    path.write_text(yaml.safe_dump(config))
    return path
