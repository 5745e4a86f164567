"""Re-hash the store against what it recorded; name what is corrupt or missing.

What is checked:
- every stage manifest (`manifest.json`): each file it lists, by size and sha256;
- every hidden-state shard: its `.bin` against its index (`<shard>.json`);
- every staged job record (`.staged/*.record.json`: training segments and shards):
  the declared checkpoint and metrics files it put in place;
- with a plan: every artifact the config builds and every shard, which must exist
  (a deleted directory is reported, and `snakemake` rebuilds it);
- every stored answer (`store.answers`): its own sha256 and its address;
- every states store's samples files (`samples/<shard>.jsonl`): each row's address against
  its ids and mask, and the file's addresses against the shard's name. A damaged one whose
  shard is finished is written again from the shard by `--fix` (the shard holds the same
  ids and masks); one whose shard is not extracted yet is quarantined, and the mix's view
  must be assigned again (delete it: the next run assigns the samples anew).

Temporaries (`.tmp-*`: a write in progress, or what a killed job or gc left) are no
artifacts and are not checked; those of dead processes are reported as stale, for
`draftsmith gc --delete` to remove, and are no finding.

`--fix` quarantines what is corrupt (each file renamed to `<name>.corrupt`, a staged
record dropped so nothing re-links the bad bytes) and prints the targets that rebuild
exactly those artifacts; it drops damaged stored answers (an atomic rewrite under the
store's lock), so the next run that asks for them generates only them. Inputs of keyed
jobs are compared by content, not by modification time (`rules/common.smk`), so
rebuilding an artifact to the same bytes leaves everything downstream as it is: the next
plain run has nothing to do.
"""

from __future__ import annotations

import json
import os
import shlex
from dataclasses import dataclass
from pathlib import Path

from draftsmith.errors import DraftsmithError
from draftsmith.formats.shards.layout import ShardError
from draftsmith.formats.shards.reader import ShardReader
from draftsmith.fsutil import atomic
from draftsmith.fsutil.atomic import TMP_PREFIX
from draftsmith.fsutil.digests import sha256_file
from draftsmith.store import answers, gc, manifest
from draftsmith.store.hashing import sample_address
from draftsmith.store.layout import MANIFEST, SHARD_SAMPLES, STAGED, shard_name, shard_path
from draftsmith.store.plan import DamagedViewError, Plan

SHARD_INDEX_GLOB = "shard-*.json"
RECORD_SUFFIX = ".record.json"
QUARANTINE_SUFFIX = ".corrupt"


class StoreDamaged(DraftsmithError):
    pass


@dataclass
class Finding:
    """One damaged or missing artifact (or shard, or training segment)."""

    where: Path  # the file whose job rebuilds it: a manifest, shard index or checkpoint
    problems: list[str]
    members: list[Path]  # what quarantine moves aside
    missing: bool = False

    @property
    def label(self) -> str:
        return "MISSING" if self.missing else "CORRUPT"


def in_temp(root: Path, path: Path) -> bool:
    """Whether `path` lies in a temporary (`.tmp-*`) under the store `root`."""
    return any(part.startswith(TMP_PREFIX) for part in path.relative_to(root).parts)


def find_manifests(root: Path) -> list[Path]:
    """Stage manifests and hidden-state shard indexes (each shard is its own artifact)."""
    found = [*root.rglob(MANIFEST), *root.rglob(SHARD_INDEX_GLOB)]
    # Staged files are hard links of the declared ones (store.staging).
    return sorted(p for p in found if STAGED not in p.parts and not in_temp(root, p))


def find_records(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob(f"{STAGED}/*{RECORD_SUFFIX}") if not in_temp(root, p))


def _is_shard(path: Path) -> bool:
    return path.match(SHARD_INDEX_GLOB)


def check(path: Path) -> list[str]:
    if not _is_shard(path):
        return manifest.check(path)
    try:
        return ShardReader(path.parent, path.stem).verify()
    except ShardError as exc:
        return [f"{path}: {exc}"]


def _members(manifest_path: Path) -> list[Path]:
    if _is_shard(manifest_path):
        names = [manifest_path.stem + ".bin", manifest_path.name]
    else:
        try:
            names = [*manifest.read(manifest_path)["files"], MANIFEST]
        except (OSError, ValueError):
            names = [MANIFEST]
    return [manifest_path.parent / name for name in names]


def check_record(record_path: Path) -> tuple[list[str], list[Path]]:
    """Problems with the files a staged job put in place, and those files."""
    artifact_dir = record_path.parent.parent
    try:
        files = json.loads(record_path.read_text())["files"]
    except (OSError, ValueError, KeyError) as exc:
        return [f"{record_path}: unreadable record ({exc})"], []
    problems, declared = [], []
    for name, expected in files.items():
        path = artifact_dir / name
        declared.append(path)
        if not path.exists():
            continue  # not linked into place yet, or removed to save space: rebuilt when needed
        if path.stat().st_size != expected["size"]:
            problems.append(f"{path}: size {path.stat().st_size} != {expected['size']}")
        elif sha256_file(path) != expected["sha256"]:
            problems.append(f"{path}: sha256 mismatch")
    return problems, declared


def check_samples(path: Path) -> list[str]:
    """Problems with a states store's samples file: rows whose address is not their ids'
    and mask's, or addresses that are not the ones its shard is named by."""
    try:
        rows = list(atomic.read_jsonl(path))
        wrong = [
            i
            for i, row in enumerate(rows, 1)
            if sample_address(row["input_ids"], row["loss_mask"]) != row["address"]
        ]
        addresses = [row["address"] for row in rows]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return [f"{path}: unreadable ({exc})"]
    if wrong:
        return [f"{path}: row {i}: its ids and mask are not its address" for i in wrong]
    if shard_name(addresses) != path.stem:
        return [f"{path}: its addresses are not those its shard is named by"]
    return []


def rewrite_samples(path: Path) -> bool:
    """Write a damaged samples file again from its finished shard; False when there is none."""
    store = path.parent.parent
    if not shard_path(store, path.stem).exists():
        return False
    reader = ShardReader(store, path.stem)
    rows = (
        {"address": s.id, "input_ids": s.input_ids.tolist(), "loss_mask": s.loss_mask.tolist()}
        for s in (reader[i] for i in range(len(reader)))
    )
    atomic.write_jsonl(path, rows)
    return True


def _samples_findings(root: Path) -> tuple[int, list[Finding]]:
    """Every samples file checked (a count) and the damaged ones."""
    paths = sorted(
        p for p in (root / "hidden").glob(f"*/{SHARD_SAMPLES}/shard-*.jsonl") if not in_temp(root, p)
    )
    return len(paths), [
        Finding(path, problems, [path]) for path in paths if (problems := check_samples(path))
    ]


def scan(root: Path, plan: Plan | None = None) -> tuple[int, list[Finding]]:
    """Everything checked (a count) and what is wrong, upstream artifacts first."""
    findings, checked = [], 0
    for path in find_manifests(root):
        checked += 1
        problems = check(path)
        if problems:
            findings.append(Finding(path, problems, _members(path)))
    reported = {m for f in findings for m in f.members}
    for record in find_records(root):
        checked += 1
        problems, declared = check_record(record)
        if problems and not reported.intersection(declared):  # a shard is reported by its index
            members = [*declared, *(record.parent / p.name for p in declared), record]
            findings.append(Finding(declared[0] if declared else record, problems, members))
    samples_checked, samples_damaged = _samples_findings(root)
    checked += samples_checked
    findings += samples_damaged
    if plan is not None:
        findings += missing(plan)
    return checked, findings


def missing(plan: Plan) -> list[Finding]:
    """The artifacts (and shards) a full run of the plan builds that are not there."""
    try:
        names = plan.mix_shard_names()
    except DamagedViewError:  # its manifest check reports it, `--fix` rebuilds it
        names = []
    wanted = [a.manifest for a in plan.built] + [plan.shard(name) for name in names]
    return [Finding(path, [f"{path}: missing"], [], missing=True) for path in wanted if not path.exists()]


def quarantine(finding: Finding) -> list[Path]:
    """Move a damaged artifact's files aside (staged copies and records are dropped)."""
    moved = []
    for member in finding.members:
        if not member.exists():
            continue
        if STAGED in member.parts:
            member.unlink()  # a hard link of the bad bytes, or the record that would re-link them
        else:
            os.replace(member, member.with_name(member.name + QUARANTINE_SUFFIX))
        moved.append(member)
    return moved


def rebuild_command(findings: list[Finding], configfiles: list[str]) -> str:
    options = [arg for path in configfiles for arg in ("--configfile", str(path))]
    return shlex.join(["snakemake", *options, *(str(f.where) for f in findings)])


def run(root: Path, plan: Plan | None, fix: bool, configfiles: list[str], say=print) -> int:
    """Check the store, report each finding, quarantine with `fix`; 1 when anything is wrong."""
    checked, findings = scan(root, plan)
    repaired = []
    for finding in findings:
        say(f"{finding.label} {finding.where}")
        for problem in finding.problems:
            say(f"  {problem}")
        if fix and finding.where.parent.name == SHARD_SAMPLES and rewrite_samples(finding.where):
            say("  written again from its shard")
            repaired.append(finding)
        elif fix and not finding.missing:
            quarantine(finding)
            say("  quarantined")
    damaged, stored = 0, 0
    for directory in answers.stores(root):
        contents = answers.read(answers.file_of(directory))
        stored += len(contents.answers) + len(contents.damaged)
        if not contents.damaged:
            continue
        damaged += len(contents.damaged)
        say(f"CORRUPT {answers.file_of(directory)}")
        for number, why in contents.damaged:
            say(f"  line {number}: {why}")
        if fix:
            answers.drop_damaged(directory)
            say(f"  dropped {len(contents.damaged)} answer(s); the next run generates only them again")
    stale = gc.stale_temps(root)
    for temp in stale:
        say(f"STALE {temp}")
    if stale:
        say("  temporaries of processes that died (not artifacts): draftsmith gc --delete removes them")
    corrupt = sum(not f.missing for f in findings)
    counts = f"{checked} checked, {corrupt} corrupt, {len(findings) - corrupt} missing"
    if repaired:
        counts += f", {len(repaired)} repaired"
    findings = [f for f in findings if f not in repaired]
    if stored:
        counts += f"; {stored} stored answers checked, {damaged} corrupt"
    say(f"verify: {counts}" + (f", {len(stale)} stale temporaries" if stale else ""))
    unassigned = [f for f in findings if f.where.parent.name == SHARD_SAMPLES]
    findings = [f for f in findings if f not in unassigned]
    if unassigned:
        say("samples files of shards not extracted yet are damaged: delete the views that list those")
        say("  shards (each mix's view under hidden/<view key>/), so that the next run assigns them again")
    if findings and (fix or corrupt == 0):
        say("rebuild exactly these with:\n  " + rebuild_command(findings, configfiles))
    elif not fix and (corrupt or damaged):
        say("quarantine the corrupt ones and rebuild them: draftsmith verify --fix")
    return 1 if findings or unassigned or damaged else 0


def main(plan: Plan, log_file: str, configfiles: list[str]) -> None:
    """Rule `verify`: report to the terminal and the rule's log; fail on any finding."""
    Path(log_file).parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "w", encoding="utf-8") as log:

        def say(line: str) -> None:
            print(line, flush=True)
            log.write(line + "\n")

        status = run(plan.root, plan, fix=False, configfiles=configfiles, say=say)
    if status:
        raise StoreDamaged(f"the store at {plan.root} has problems (listed above and in {log_file})")
