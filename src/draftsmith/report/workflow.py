"""What rules/report.smk needs from Python: report markers and the end-of-run HTML report.

Kept out of the .smk file because `snakemake --lint` wants rules and functions apart.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from snakemake.io import report


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


def write_html_report(workflow, path: Path) -> None:
    """`onsuccess`: when this run's DAG held rule `report`, write the HTML report."""
    if not any(job.rule.name == "report" for job in workflow.dag.jobs):
        return
    command = report_command(sys.argv, Path(path).resolve())
    if command is None:
        print(f"draftsmith: to write the HTML report run: snakemake --report {path}", file=sys.stderr)
        return
    print(f"draftsmith: writing the HTML report: {shlex.join(command)}", file=sys.stderr)
    # From the directory snakemake started in: a relative --directory or --configfile
    # in the command line still resolves.
    subprocess.run(command, cwd=workflow.workdir_init, check=True)
