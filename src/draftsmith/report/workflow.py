"""What rules/report.smk needs from Python: report markers and the HTML report of the run.

Kept out of the .smk file because `snakemake --lint` wants rules and functions apart.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from snakemake.io import report

from draftsmith.errors import DraftsmithError
from draftsmith.fsutil import atomic


class ReportError(DraftsmithError):
    pass


@dataclass(frozen=True)
class ReportedFiles:
    """Results files marked for `snakemake --report`, each captioned by report/<stem>.rst."""

    results_dir: Path
    experiment: str

    def __call__(self, name: str, category: str, subcategory: str, item: str):
        return report(
            str(self.results_dir / name),
            caption=f"../report/{Path(name).stem}.rst",  # relative to rules/
            category=category,
            subcategory=subcategory,
            labels={"experiment": self.experiment, "item": item},
        )


def report_command(argv: list[str], path: Path) -> list[str] | None:
    """This run's command line as a `--report` run (same targets, config, options).

    None when it cannot be repeated: not started from the snakemake CLI (the API), or
    already a run that writes a report itself (`--report-after-run`).
    """
    program = Path(argv[0])  # .../bin/snakemake, or .../snakemake/__main__.py for -m
    if "snakemake" not in (program.name, program.parent.name):
        return None
    if any(arg == "--report" or arg.startswith("--report=") for arg in argv):
        return None
    return [sys.executable, "-m", "snakemake", *argv[1:], "--report", str(path)]


# The command line of the snakemake run, recorded at parse time by the main process
# for its jobs (each runs in a `snakemake --target-jobs` subprocess of its own).
RUN_ARGV = "DRAFTSMITH_RUN_ARGV"


def remember_command_line() -> None:
    if "--target-jobs" not in sys.argv:
        os.environ[RUN_ARGV] = json.dumps(sys.argv)


def write_html_report(path: Path, log_file: str, workdir: str) -> None:
    """Rule `report_html`: Snakemake's HTML report of this run (its command line repeated
    with `--report`), written under a temp name and renamed into place, so a kill
    leaves no report.html that looks finished."""
    final = Path(path).resolve()
    tmp = final.with_name(atomic.temp_name(final.stem) + final.suffix)  # --report wants .html
    command = report_command(json.loads(os.environ.get(RUN_ARGV, "[]")) or sys.argv, tmp)
    if command is None:
        raise ReportError(f"cannot repeat this run as a report run: write it with snakemake --report {path}")
    # This run holds the working directory's lock; the report run only reads.
    command.append("--nolock")
    print(f"draftsmith: writing the HTML report: {shlex.join(command)}", file=sys.stderr)
    with open(log_file, "w", encoding="utf-8") as log:
        done = subprocess.run(command, cwd=workdir, stdout=log, stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0 or not tmp.exists():
        tmp.unlink(missing_ok=True)
        raise ReportError(f"snakemake --report failed (exit {done.returncode}); see {log_file}")
    os.replace(tmp, final)
    atomic.fsync_dir(final.parent)
