"""The run's reports: plots, the benchmark summary Markdown, and HTML pages of the reports.

`build.build_report` is what rule `report` runs; `plots`, `summary` and `markdown` are
plain functions of the JSON artifacts, testable without Snakemake.
"""

from draftsmith.reporting.build import build_report

__all__ = ["build_report"]
