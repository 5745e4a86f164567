"""The store's promise on the default config, as a user meets it; prints a table.

1. Two fresh clones of this repository start `snakemake` together on one empty store
   (an absolute `artifacts_dir`): both must finish, every answer store must hold each
   answer once, and no keyed job may be built by both.
2. Then, from the first clone: the experiment renamed, `results/` deleted, and a third
   clone (datasets with new modification times) must each dry-run to report jobs only.

    python bench/shared_store.py [--work DIR]

Runs the default pipeline twice at once (about 10 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from draftsmith.store.layout import ANSWERS, ANSWERS_FILE

REPO = Path(__file__).resolve().parents[1]
REPORT_JOBS = {"hidden_estimate", "report", "report_html", "all"}


def clone(target: Path) -> Path:
    subprocess.run(["git", "clone", "-q", str(REPO), str(target)], check=True)
    return target


def snakemake(work: Path, *args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "snakemake", "--cores", "2", *args]
    return subprocess.run(command, cwd=work, capture_output=True, text=True)


def planned(result: subprocess.CompletedProcess) -> dict[str, int]:
    out = result.stdout + result.stderr
    if "Nothing to be done" in out:
        return {}
    table = out.split("Job stats:", 1)[1].split("total", 1)[0]
    return {m[0]: int(m[1]) for m in re.findall(r"^(\w+)\s+(\d+)$", table, re.MULTILINE)}


def built_once(works: list[Path]) -> tuple[int, int]:
    """(keyed jobs, keyed jobs built by more than one clone) from the job logs."""
    builders: dict[str, int] = {}
    for work in works:
        for log in (work / "logs").rglob("*.log"):
            text = log.read_text()
            job = str(log.relative_to(work / "logs"))
            if job.startswith(("report", "hidden_estimate")):
                continue
            if "finished in" in text and "already built" not in text:
                builders[job] = builders.get(job, 0) + 1
    return len(builders), sum(n > 1 for n in builders.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=None, help="scratch directory (default: a temp dir)")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="shared-store-"))
    store = work / "store"
    first, second = clone(work / "first"), clone(work / "second")
    option = ["--config", f"artifacts_dir={store}"]
    started = time.monotonic()
    procs = [
        subprocess.Popen([sys.executable, "-m", "snakemake", "--cores", "2", *option], cwd=w,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for w in (first, second)
    ]  # fmt: skip
    codes = [p.wait() for p in procs]
    wall = time.monotonic() - started
    duplicated_ids = 0
    for journal in store.glob(f"{ANSWERS}/*/{ANSWERS_FILE}"):
        stored = [json.loads(line)["address"] for line in journal.read_text().splitlines()]
        duplicated_ids += len(stored) - len(set(stored))
    jobs, twice = built_once([first, second])

    rows = [
        ("two clones at once: exit codes", " ".join(map(str, codes))),
        ("two clones at once: wall time", f"{wall / 60:.1f} min"),
        ("keyed jobs / built by both clones", f"{jobs} / {twice}"),
        ("stored answers duplicated", str(duplicated_ids)),
    ]
    renamed = planned(snakemake(first, "-n", *option, "experiment=renamed"))
    rows.append(("dry run, experiment renamed", ", ".join(sorted(renamed)) or "nothing"))
    shutil.move(first / "results", work / "results-aside")
    gone = planned(snakemake(first, "-n", *option))
    shutil.move(work / "results-aside", first / "results")
    rows.append(("dry run, results/ deleted", ", ".join(sorted(gone)) or "nothing"))
    third = clone(work / "third")
    cloned = planned(snakemake(third, "-n", *option))
    rows.append(("dry run, a third clone", ", ".join(sorted(cloned)) or "nothing"))
    verified = subprocess.run(
        [sys.executable, "-m", "draftsmith", "verify", "--configfile", "config.yaml", str(store)], cwd=first
    ).returncode
    rows.append(("draftsmith verify exit code", str(verified)))

    print("| check | result |\n| --- | --- |\n" + "\n".join(f"| {k} | {v} |" for k, v in rows))
    ok = codes == [0, 0] and twice == 0 and duplicated_ids == 0 and verified == 0
    ok &= all(set(p) <= REPORT_JOBS for p in (renamed, gone, cloned))
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
