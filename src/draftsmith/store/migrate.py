"""Bring an older store into the current layout, in place, with no forward pass.

- Stage renames: `draft_vocab`, `draft` and `eval` are now `vocab`, `train` and
  `evaluate`, and the hidden stage's `plan.json` is now `assignment.json`. Those keys did
  not change (they still hash the old names, see `keys.HASHED_NAMES`), so moving whole
  key directories and relabelling manifests is that part.
- Answer store: answers generated before it (`store.answers`) sit in each responses
  artifact's `journal.jsonl` and `responses.jsonl`; each is imported into the answer store
  of that artifact's generation key (from its manifest's params and model key) under the
  address of its messages, so nothing is generated again. An artifact without a manifest
  (a job that never finished) is left, named: its settings are not recorded.
- States stores: hidden states were kept per mix (`hidden/<key of model, mix and
  settings>/shard-NNNNN.*`); they are now kept per sample in one store per model and
  extraction settings (`hidden.assign`). Each old shard is linked into its states store
  under its new name (the hash of its samples' addresses, computed from the ids and masks
  the shard holds), with its samples file and an index whose rows name addresses; the
  `.bin` is a hard link, so no byte of states is copied or recomputed. The old directory
  stays until `draftsmith gc` removes it (no config plans it any more).

Every step looks before it acts, so a run after a crash finishes the job and a run after
that finds nothing to do.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from draftsmith.formats.shards.layout import SHARD_SUFFIXES, manifest_text
from draftsmith.formats.shards.reader import ShardReader
from draftsmith.fsutil import atomic
from draftsmith.store import answers, manifest
from draftsmith.store.gc import artifact_dirs, dataset_dirs, key_dirs
from draftsmith.store.hashing import sample_address
from draftsmith.store.journal import complete_records
from draftsmith.store.keys import HASHED_NAMES, stage_key
from draftsmith.store.layout import (
    FILES,
    JOURNAL,
    MANIFEST,
    answer_store,
    shard_name,
    shard_path,
    shard_samples_path,
)

# Old stage word -> current one: the names keys hash are the names the stages had.
RENAMED = {old: new for new, old in HASHED_NAMES.items()}
OLD_ASSIGNMENT = "plan.json"


@dataclass(frozen=True)
class Step:
    """One thing the migration does (or, on a dry run, would do); `left` changes nothing."""

    action: str  # move, remove, rewrite, import, link or left
    path: Path
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.action:<8} {self.path}" + (f" {self.detail}" if self.detail else "")


def migrate(root: Path, dry_run: bool = False) -> Iterator[Step]:
    """Each step as it is taken (a dry run only yields them)."""
    moved: list[Path] = []
    for old, new in RENAMED.items():
        yield from _move_stage(root / old, root / new, dry_run, moved)
    for hidden in key_dirs(root / "hidden"):
        source = hidden / OLD_ASSIGNMENT
        if source.exists():
            yield _move(source, hidden / FILES["hidden"]["assignment"], dry_run)
    # On a dry run the moved directories are still under their old names.
    for directory in sorted({*artifact_dirs(root), *moved}):
        step = _relabel(directory / MANIFEST, dry_run)
        if step is not None:
            yield step
    for dataset in dataset_dirs(root / "responses"):
        for directory in key_dirs(dataset):
            step = _import_answers(root, directory, dry_run)
            if step is not None:
                yield step

    for hidden in key_dirs(root / "hidden"):
        yield from _link_states(hidden, dry_run)


def _import_answers(root: Path, directory: Path, dry_run: bool) -> Step | None:
    """Store the answers of one responses artifact (its journal and its declared records)
    that its generation key's answer store lacks."""
    sources = [p for p in (directory / JOURNAL, directory / FILES["responses"]["responses"]) if p.exists()]
    if not sources:
        return None
    if not (directory / MANIFEST).exists():
        return Step("left", directory, "(no manifest: its generation settings are unknown)")
    recorded = manifest.read(directory / MANIFEST)
    store = answer_store(root, recorded["upstream"]["model"], recorded["params"]["generation"])
    records: dict[str, dict] = {}
    for source in sources:
        for record in complete_records(source.read_bytes())[0]:  # a journal's torn tail is no answer
            records.setdefault(answers.address(record["messages"]), record)
    present = {a[answers.ADDRESS] for a in answers.read(answers.file_of(store)).answers}
    new = [at for at in records if at not in present]
    if new and not dry_run:
        with answers.opened(store) as opened:
            new = [at for at in new if at not in opened]  # another process may have stored some
            for at in new:
                opened.put(records[at], at)
    return Step("import", directory, f"({len(new)} answers -> {store})") if new else None


def _old_states(hidden: Path) -> dict | None:
    """The manifest of a hidden-state directory of the per-mix layout, or None."""
    try:
        record = manifest.read(hidden / MANIFEST)
    except (OSError, ValueError):
        return None
    return record if record.get("params", {}).get("num_shards") is not None else None


def _link_states(hidden: Path, dry_run: bool) -> Iterator[Step]:
    """Link a per-mix directory's shards into the states store of its model and settings."""
    record = _old_states(hidden)
    if record is None:
        return
    params = {k: v for k, v in record["params"].items() if k != "num_shards"}
    store = hidden.parent / stage_key("hidden", params, {"model": record["upstream"]["model"]})
    for index in sorted(hidden.glob(f"shard-*{SHARD_SUFFIXES['index']}")):
        step = _link_shard(hidden, index.stem, store, dry_run)
        if step is not None:
            yield step


def _link_shard(hidden: Path, old_name: str, store: Path, dry_run: bool) -> Step | None:
    """Link one old shard into `store`; None when it is there already (its index is written last)."""
    reader = ShardReader(hidden, old_name)
    rows = [(sample_address(s.input_ids.numpy(), s.loss_mask.numpy()), s) for s in reader]
    name = shard_name([address for address, _ in rows])
    target = shard_path(store, name)
    if target.exists():
        return None
    if not dry_run:
        samples = shard_samples_path(store, name)
        if not samples.exists():
            atomic.write_jsonl(
                samples,
                (
                    {"address": a, "input_ids": s.input_ids.tolist(), "loss_mask": s.loss_mask.tolist()}
                    for a, s in sorted(rows, key=lambda row: row[0])
                ),
            )
        data = shard_path(store, name, "bin")
        if not data.exists():
            os.link(reader.bin_path, data)
        index = dict(reader.manifest)
        index["bin"] = {**index["bin"], "name": data.name}
        index["meta"] = {**index["meta"], "shard": name, "states_key": store.name, "migrated_from": old_name}
        index["samples"] = [
            [address, *row[1:]] for (address, _), row in zip(rows, index["samples"], strict=True)
        ]
        atomic.write_text(target, manifest_text(index))  # the index last: the shard is whole
    return Step("link", hidden / old_name, f"-> {target}")


def _move_stage(old: Path, new: Path, dry_run: bool, moved: list[Path]) -> Iterator[Step]:
    """Move a renamed stage's key directories, appending where each now lies to `moved`."""
    for source in key_dirs(old):
        step = _move(source, new / source.name, dry_run)
        yield step
        if step.action == "move":
            moved.append(source if dry_run else new / source.name)
    if old.is_dir() and all(p in moved for p in old.iterdir()):
        yield Step("remove", old, "(empty)")
        if not dry_run:
            old.rmdir()


def _move(source: Path, target: Path, dry_run: bool) -> Step:
    if target.exists():
        return Step("left", source, f"({target} exists)")
    if not dry_run:
        target.parent.mkdir(parents=True, exist_ok=True)
        os.rename(source, target)
        atomic.fsync_dir(source.parent)
        atomic.fsync_dir(target.parent)
    return Step("move", source, f"-> {target}")


def _relabel(path: Path, dry_run: bool) -> Step | None:
    """Rewrite a manifest's stage and upstream labels where they use an old name."""
    if not path.exists():
        return None
    try:
        old = manifest.read(path)
    except (OSError, ValueError) as exc:
        return Step("left", path, f"(unreadable: {exc})")
    renames = _renames(old)
    if not renames:
        return None
    if not dry_run:
        atomic.write_json(path, _relabelled(old))
    return Step("rewrite", path, f"({', '.join(renames)})")


def _renames(record: dict) -> list[str]:
    """The stage and upstream labels of a manifest that use an old stage word."""
    labels = [("stage", record["stage"])] if "stage" in record else []
    labels += [("upstream", label) for label in record.get("upstream", {})]
    return [f"{field} {label} -> {_label(label)}" for field, label in labels if _label(label) != label]


def _relabelled(record: dict) -> dict:
    new = dict(record)
    if "stage" in new:
        new["stage"] = _label(new["stage"])
    if "upstream" in new:
        new["upstream"] = {_label(label): key for label, key in new["upstream"].items()}
    return new


def _label(label: str) -> str:
    """A stage word (or `stage/dataset` label) in the current words."""
    stage, slash, rest = label.partition("/")
    return RENAMED.get(stage, stage) + slash + rest
