"""Wall time of every job of a config's last run, from the rules' Snakemake `benchmark:` files.

python bench/stage_times.py --configfile configs/smollm2-medium-h200.yaml
"""

from __future__ import annotations

import argparse
import csv
from collections import defaultdict
from pathlib import Path

import yaml

from draftsmith.workflow import configure


def planned_keys(config: dict) -> set[str]:
    return {artifact.key for artifact in configure(config).plan.artifacts}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configfile", type=Path, required=True)
    parser.add_argument("--benchmarks", type=Path, default=Path("benchmarks"))
    args = parser.parse_args()
    keys = planned_keys(yaml.safe_load(args.configfile.read_text()))
    totals: dict[str, list[float]] = defaultdict(list)
    for path in sorted(args.benchmarks.rglob("*.tsv")):
        if not keys & (set(path.parts) | {path.stem}):
            continue
        with path.open() as handle:
            rows = list(csv.DictReader(handle, delimiter="\t"))
        if rows:
            totals[path.relative_to(args.benchmarks).parts[0]].append(float(rows[-1]["s"]))
    print("| rule | jobs | wall s (sum) | wall s (longest job) |\n|---|---|---|---|")
    for rule, times in totals.items():
        print(f"| {rule} | {len(times)} | {sum(times):.1f} | {max(times):.1f} |")


if __name__ == "__main__":
    main()
