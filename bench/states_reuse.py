"""Hidden-state reuse across data edits: what each change to the default config costs.

Runs `snakemake hidden` on a copy of the default config (config.yaml, its datasets
copied to a work directory), then applies each change alone to that config and runs it
again on the same store: drop a dataset, add a fourth dataset, change merge.seed,
append 10 rows to one dataset file, fix one row of one file, raise one dataset's
max_samples. Prints one Markdown table: hidden_shard jobs run, tokens forwarded through
the target (the new shards' tokens), bytes written to the hidden store, and the mix's
samples the store lacked (what justifies them).

    python bench/states_reuse.py [--keep DIR]
"""

from __future__ import annotations

import argparse
import copy
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import yaml

from draftsmith.workflow import configure

REPO = Path(__file__).resolve().parents[1]


def store_files(hidden: Path) -> dict[tuple[int, int], int]:
    """(device, inode) -> size of every file under the hidden stage: a hard link counts once."""
    found = {}
    for path in hidden.rglob("*") if hidden.is_dir() else []:
        if path.is_file() and ".tmp-" not in path.name:
            stat = path.stat()
            found[(stat.st_dev, stat.st_ino)] = stat.st_size
    return found


def run(work: Path, config: dict, name: str) -> dict:
    """`snakemake hidden` on `config`; what it ran, forwarded and wrote."""
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    plan = configure(copy.deepcopy(config))
    hidden = plan.states.directory.parent
    before_files = store_files(hidden)
    before_shards = {p.name for p in plan.states.directory.glob("shard-*.json")}
    started = time.monotonic()
    cmd = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "-d", str(work)]
    result = subprocess.run(
        [*cmd, "--configfile", str(path), "--cores", "2", "hidden"], capture_output=True, text=True
    )
    if result.returncode != 0:
        raise SystemExit(f"{name}: snakemake failed\n{result.stderr[-3000:]}")
    new = [p for p in plan.states.directory.glob("shard-*.json") if p.name not in before_shards]
    view = json.loads(plan.hidden.path("assignment").read_text())
    after_files = store_files(hidden)
    return {
        "change": name,
        "jobs": (result.stdout + result.stderr).count("rule hidden_shard:"),
        "tokens": sum(json.loads(p.read_text())["num_tokens"] for p in new),
        "bytes": sum(size for inode, size in after_files.items() if inode not in before_files),
        "mix": view["num_samples"],
        "missing": view["distinct_samples"] - view["stored_samples"],
        "seconds": round(time.monotonic() - started, 1),
    }


def rows(path: Path) -> list[str]:
    return path.read_text().splitlines()


def changes(work: Path, base: dict) -> dict[str, Callable[[], dict]]:
    """Each change alone, applied to a copy of the base config (files edited as copies)."""

    def edited(name: str, dataset: str, lines: list[str], **settings) -> dict:
        config = copy.deepcopy(base)
        copy_path = work / f"{dataset}-{name}.jsonl"
        copy_path.write_text("\n".join(lines) + "\n")
        config["datasets"][dataset].update(path=str(copy_path), **settings)
        return config

    code = Path(base["datasets"]["code"]["path"])
    chat = Path(base["datasets"]["chat"]["path"])

    def drop() -> dict:
        config = copy.deepcopy(base)
        del config["datasets"]["math"]
        return config

    def add() -> dict:
        config = copy.deepcopy(base)
        prompts = work / "prose.jsonl"
        words = ["river", "lantern", "orbit", "harvest", "signal", "marble", "canyon", "thread"]
        lines = [json.dumps({"prompt": f"Write one sentence about a {w} at dawn."}) for w in words]
        prompts.write_text("\n".join(lines) + "\n")
        config["datasets"]["prose"] = {"path": str(prompts), "format": "prompt", "max_samples": 40}
        return config

    def seed() -> dict:
        return {**copy.deepcopy(base), "merge": {**base["merge"], "seed": 1}}

    def append() -> dict:
        more = [
            json.dumps({"prompt": f"Write a Python function that returns {i} squared."}) for i in range(10)
        ]
        return edited("append", "code", rows(code) + more)

    def fix() -> dict:
        lines = rows(chat)
        record = json.loads(lines[3])
        record["messages"][-1]["content"] = record["messages"][-1]["content"].rstrip(".?!") + ", briefly?"
        lines[3] = json.dumps(record)
        return edited("fix", "chat", lines)

    def raise_cap() -> dict:
        config = copy.deepcopy(base)
        config["datasets"]["code"]["max_samples"] = 50
        return config

    return {
        "drop a dataset (math)": drop,
        "add a fourth dataset (8 prompts)": add,
        "merge.seed 0 -> 1": seed,
        "append 10 rows to code.jsonl": append,
        "fix one row of chat.jsonl": fix,
        "raise code max_samples 40 -> 50": raise_cap,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", type=Path, default=None, help="work directory to use and keep")
    args = parser.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="states-reuse-"))
    work.mkdir(parents=True, exist_ok=True)
    base = yaml.safe_load((REPO / "config.yaml").read_text())
    base.update(artifacts_dir=str(work / "artifacts"), logs_dir=str(work / "logs"))
    for name, entry in base["datasets"].items():
        copied = work / f"{name}.jsonl"
        shutil.copy(REPO / entry["path"], copied)
        entry["path"] = str(copied)
    for entry in base["evaluate"]["prompt_sets"].values():
        entry["path"] = str(REPO / entry["path"])
    columns = ["change", "hidden_shard jobs", "tokens forwarded", "bytes written to hidden/"]
    columns += ["mix samples", "samples the store lacked", "wall s"]
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns), flush=True)
    runs = {"full run (default config)": lambda: base, **changes(work, base)}
    for name, make in runs.items():  # each row as it is measured
        r = run(work, make(), name)
        cells = [
            r["change"],
            r["jobs"],
            f"{r['tokens']:,}",
            f"{r['bytes']:,}",
            r["mix"],
            r["missing"],
            r["seconds"],
        ]
        print("| " + " | ".join(map(str, cells)) + " |", flush=True)
    if args.keep is None:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
