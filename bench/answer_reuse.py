"""Answers generated and reused by each data edit on the default config; prints a table.

In a scratch directory holding a copy of config.yaml and resources/datasets, `snakemake`
builds every dataset's responses, then applies each change alone (the base restored
between changes) and builds the responses again. For each change, from the manifests of
the responses built by that run: answers generated (backend requests) and reused from
the answer store, what the previous code would have requested (every sample of a
responses artifact with a new key: its journal started empty), the prompts new to the
store that justify the requests, and the bytes the answer store grew by.

    python bench/answer_reuse.py [--work DIR]

The full base run generates 120 answers of up to 96 tokens on CPU (minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import yaml

from draftsmith.formats.markdown import table
from draftsmith.store import answers, manifest
from draftsmith.store.layout import ANSWERS, ANSWERS_FILE
from draftsmith.store.plan import Plan
from draftsmith.workflow import configure

REPO = Path(__file__).resolve().parents[1]
DATASETS = Path("resources/datasets")
EXTRA = [
    f"Give one practical tip about {topic}." for topic in ("gardening", "cycling", "saving money", "sleep")
]
EXTRA += [f"Explain {thing} in two sentences." for thing in ("a rainbow", "compound interest", "a compiler")]
EXTRA += [f"Suggest a name for a {pet}." for pet in ("cat", "dog", "goldfish")]
SKILLS = (
    "chess",
    "knitting",
    "Spanish",
    "the piano",
    "sailing",
    "pottery",
    "chemistry",
    "yoga",
    "drawing",
    "Rust",
)
APPENDED = [f"What is a good first step when learning {skill}?" for skill in SKILLS]


def append_rows(work: Path, config: dict) -> str:
    rows = "".join(json.dumps({"messages": [{"role": "user", "content": q}]}) + "\n" for q in APPENDED)
    with open(work / DATASETS / "chat.jsonl", "a", encoding="utf-8") as handle:
        handle.write(rows)
    return "append 10 rows to chat.jsonl (58 rows, max_samples 40)"


def fix_row(work: Path, config: dict) -> str:
    path = work / DATASETS / "code.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    row = json.loads(lines[5])
    row["prompt"] = row["prompt"].rstrip(".?") + ", briefly."
    lines[5] = json.dumps(row) + "\n"
    path.write_text("".join(lines))
    return "fix one row of code.jsonl (row 5 reworded)"


def raise_max_samples(work: Path, config: dict) -> str:
    config["datasets"]["math"]["max_samples"] = 50
    return "raise math's max_samples 40 -> 50"


def drop_dataset(work: Path, config: dict) -> str:
    del config["datasets"]["math"]
    return "drop the dataset math"


def add_dataset(work: Path, config: dict) -> str:
    path = work / DATASETS / "extra.jsonl"
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in EXTRA))
    config["datasets"]["extra"] = {"path": str(DATASETS / "extra.jsonl"), "format": "prompt"}
    return f"add a fourth dataset (extra, {len(EXTRA)} prompts)"


def change_seed(work: Path, config: dict) -> str:
    config["merge"]["seed"] = 1
    return "change merge.seed 0 -> 1"


CHANGES: list[Callable[[Path, dict], str]] = [
    drop_dataset,
    add_dataset,
    change_seed,
    append_rows,
    fix_row,
    raise_max_samples,
]


def plan_of(config: dict) -> Plan:
    return configure(copy.deepcopy(config))


def store_bytes(work: Path) -> int:
    return sum(p.stat().st_size for p in (work / "artifacts" / ANSWERS).glob(f"*/{ANSWERS_FILE}"))


def addresses(plan: Plan) -> set[str]:
    found = set()
    for artifact in plan.responses.values():
        for line in artifact.path("responses").read_text().splitlines():
            found.add(answers.address(json.loads(line)["messages"]))
    return found


def build(work: Path, config: dict) -> dict:
    """Build every dataset's responses; the counts of the responses this run built."""
    (work / "config.yaml").write_text(yaml.safe_dump(config))
    plan = plan_of(config)
    before = {a.manifest for a in plan.responses.values() if a.manifest.exists()}
    grown = store_bytes(work)
    command = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "-d", str(work)]
    command += ["--configfile", str(work / "config.yaml"), "--cores", "2"]
    command += [str(a.manifest) for a in plan.responses.values()]
    subprocess.run(command, check=True, capture_output=True)
    built = [manifest.read(a.manifest)["stats"] for a in plan.responses.values() if a.manifest not in before]
    return {
        "jobs": len(built),
        "generated": sum(s["answers_generated"] for s in built),
        "reused": sum(s["answers_reused"] for s in built),
        "previously": sum(s["samples"] for s in built),
        "bytes": store_bytes(work) - grown,
        "plan": plan,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work", type=Path, help="scratch directory (default: a new temp dir)")
    args = parser.parse_args()
    work = (args.work or Path(tempfile.mkdtemp(prefix="answer-reuse-"))).resolve()
    shutil.copy(REPO / "config.yaml", work / "config.yaml")
    base = yaml.safe_load((REPO / "config.yaml").read_text())
    os.chdir(work)  # the config's relative paths (datasets, artifacts) are the workflow directory's

    def restore() -> None:
        shutil.rmtree(work / DATASETS, ignore_errors=True)
        shutil.copytree(REPO / DATASETS, work / DATASETS)

    restore()
    first = build(work, base)
    seen = addresses(first["plan"])
    rows = [["full run of the default config", *counts(first, len(seen))]]
    for change in CHANGES:
        config = copy.deepcopy(base)
        label = change(work, config)
        result = build(work, config)
        new = addresses(result["plan"]) - seen
        rows.append([label, *counts(result, len(new))])
        restore()
    print(f"store: {work / 'artifacts'}")
    header = [
        "change",
        "responses jobs",
        "generated",
        "reused",
        "previous code",
        "new prompts",
        "store bytes",
    ]
    print(table(header, rows))


def counts(result: dict, new_prompts: int) -> list[str]:
    return [
        str(result["jobs"]),
        str(result["generated"]),
        str(result["reused"]),
        str(result["previously"]),
        str(new_prompts),
        f"{result['bytes']:,}",
    ]


if __name__ == "__main__":
    main()
