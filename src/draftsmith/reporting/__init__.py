"""The run's reports: plots, the benchmark summary Markdown, and HTML pages of the reports.

`build.build_report` is what rule `report` runs; `plots`, `summary` and `markdown` are
plain functions of the JSON artifacts, testable without Snakemake. Nothing is imported
here: rules/report.smk imports `workflow` at parse time, which must not load matplotlib.
"""
