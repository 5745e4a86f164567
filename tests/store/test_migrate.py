"""draftsmith.store.migrate and `draftsmith migrate`: a store written under the old stage
names ends up exactly where today's plan looks, manifests relabelled, keys unchanged; a
per-mix hidden-state directory's shards are linked into their states store."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from conftest import stand_in_config

from draftsmith import cli
from draftsmith.formats.responses import Usage, response_record
from draftsmith.fsutil import atomic
from draftsmith.store import answers, manifest, migrate
from draftsmith.store.hashing import derive_key, sample_address
from draftsmith.store.keys import STAGE_VERSIONS
from draftsmith.store.layout import FILES, JOURNAL, MANIFEST, shard_name
from draftsmith.store.plan import Artifact, Plan
from draftsmith.workflow import configure

# The stage words before the renames, as the store on disk still spells them.
OLD_NAMES = {"vocab": "draft_vocab", "train": "draft", "evaluate": "eval"}
RELABELLED = ("vocab", "train", "export", "evaluate")
PAST = 1_000_000_000


def old_label(label: str) -> str:
    stage, slash, rest = label.partition("/")
    return OLD_NAMES.get(stage, stage) + slash + rest


def old_key(artifact: Artifact) -> str:
    """The key the code before the renames gave the artifact: it hashed its own stage words."""
    return derive_key(
        {
            "stage": old_label(artifact.stage),
            "version": STAGE_VERSIONS[artifact.stage],
            "params": artifact.params,
            "upstream": {old_label(label): key for label, key in artifact.upstream.items()},
        }
    )


def write_old(plan: Plan, artifact: Artifact) -> Path:
    """The artifact as the code before the renames wrote it (a manifest last, dated long ago)."""
    if artifact is plan.states:
        return artifact.directory  # no states store before: hidden states were kept per mix
    dataset = artifact.directory.parent.relative_to(plan.root / artifact.stage)
    directory = plan.root / old_label(artifact.stage) / dataset / old_key(artifact)
    if artifact.stage == "hidden":
        directory.mkdir(parents=True)
        (directory / "plan.json").write_text('{"num_shards": 1}')
        return directory
    data = directory / next(iter(FILES[artifact.stage].values()))
    data.parent.mkdir(parents=True)
    data.write_text(f"{artifact.stage} data")
    upstream = {old_label(label): key for label, key in artifact.upstream.items()}
    old = Artifact(old_label(artifact.stage), artifact.params, upstream, directory, artifact.key)
    manifest.write(old, directory / MANIFEST, [data], {}, time.time())
    os.utime(directory / MANIFEST, (PAST, PAST))
    return directory


@pytest.fixture
def plan(tmp_path: Path) -> Plan:
    return configure(stand_in_config(tmp_path)).plan


@pytest.fixture
def old_store(plan: Plan) -> Path:
    for artifact in plan.artifacts:
        write_old(plan, artifact)
    return plan.root


def snapshot(root: Path) -> dict[Path, tuple[int, bytes]]:
    return {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in root.rglob("*") if p.is_file()}


def test_old_keys_are_the_planned_keys(plan):
    assert [old_key(a) for a in plan.artifacts] == [a.key for a in plan.artifacts]


def test_migration_lands_every_artifact_where_the_plan_looks(plan, old_store):
    steps = list(migrate.migrate(old_store))
    assert sorted(s.action for s in steps) == ["move"] * 4 + ["remove"] * 3 + ["rewrite"] * 4
    for old in OLD_NAMES.values():
        assert not (old_store / old).exists()
    assert plan.hidden.path("assignment").exists()
    assert not (plan.hidden.directory / "plan.json").exists()
    for artifact in plan.artifacts:
        if artifact.stage == "hidden":
            continue
        record = manifest.read(artifact.manifest)
        assert (record["stage"], record["key"]) == (artifact.stage, artifact.key)
        assert record["upstream"] == artifact.upstream
        assert record["params"] == json.loads(json.dumps(artifact.params))
        assert manifest.check(artifact.manifest) == []
        rewritten = artifact.manifest.stat().st_mtime != PAST
        assert rewritten == (artifact.stage in RELABELLED), artifact.stage


def test_a_second_run_has_nothing_to_do(old_store, capsys):
    assert cli.main(["migrate", str(old_store)]) == 0
    assert "move" in capsys.readouterr().out
    after = snapshot(old_store)
    assert cli.main(["migrate", str(old_store)]) == 0
    assert capsys.readouterr().out == "migrate: nothing to do\n"
    assert snapshot(old_store) == after


def test_dry_run_changes_nothing_and_prints_the_real_steps(old_store, capsys):
    before = snapshot(old_store)
    assert cli.main(["migrate", str(old_store), "--dry-run"]) == 0
    *planned, summary = capsys.readouterr().out.splitlines()
    assert summary == f"migrate: dry run, {len(planned)} steps not taken"
    assert snapshot(old_store) == before
    assert [str(s) for s in migrate.migrate(old_store)][: len(planned) - 4] == planned[:-4]
    # Only the rewrites differ: on a dry run the manifests are still under the old names.
    assert [line.split()[0] for line in planned[-4:]] == ["rewrite"] * 4


def test_a_move_finished_before_a_crash_is_completed(plan, old_store):
    plan.vocab.directory.parent.mkdir()
    os.rename(old_store / "draft_vocab" / plan.vocab.key, plan.vocab.directory)
    steps = list(migrate.migrate(old_store))
    assert plan.vocab.manifest in [s.path for s in steps if s.action == "rewrite"]
    assert manifest.read(plan.vocab.manifest)["stage"] == "vocab"
    assert list(migrate.migrate(old_store)) == []


def test_a_taken_destination_leaves_the_source(plan, old_store, capsys):
    plan.train.directory.mkdir(parents=True)
    source = old_store / "draft" / plan.train.key
    before = snapshot(source)
    assert cli.main(["migrate", str(old_store)]) == 1
    assert f"left     {source} ({plan.train.directory} exists)" in capsys.readouterr().out
    assert snapshot(source) == before
    assert plan.vocab.directory.is_dir() and plan.evaluate.directory.is_dir()


# --- answers generated before the answer store ----------------------------------------------
def old_responses(plan: Plan, dataset: str, texts: list[str], finished: bool = True) -> Path:
    """A responses artifact as the code before the answer store left it: its records in
    `journal.jsonl` (a torn tail from a kill) and, when finished, `responses.jsonl` and a manifest."""
    artifact = plan.responses[dataset]
    records = [
        response_record(
            prompt_id=f"{dataset}-{i:06d}",
            dataset=dataset,
            index=i,
            messages=[{"role": "user", "content": text}],
            response=f"answer to {text}",
            finish_reason="stop",
            usage=Usage(3, 4),
        )
        for i, text in enumerate(texts)
    ]
    artifact.directory.mkdir(parents=True)
    lines = "".join(json.dumps(r) + "\n" for r in records)
    (artifact.directory / JOURNAL).write_text(lines + '{"id": "torn')
    if finished:
        atomic.write_jsonl(artifact.path("responses"), records)
        atomic.write_jsonl(artifact.path("bad_rows"), [])
        files = [artifact.path("responses"), artifact.path("bad_rows")]
        manifest.write(artifact, artifact.manifest, files, {}, time.time())
    return artifact.directory


def test_old_responses_are_imported_into_the_answer_store_once(plan, capsys):
    chat = old_responses(plan, "chat", ["Hi.", "Name a fruit."])
    code = old_responses(plan, "code", ["Name a fruit.", "Write a loop."], finished=False)
    assert cli.main(["migrate", str(plan.root), "--dry-run"]) == 1  # the unfinished one is left
    out = capsys.readouterr().out
    assert f"import   {chat} (2 answers -> {plan.answers['chat']})" in out
    assert not plan.answers["chat"].exists()

    steps = [str(s) for s in migrate.migrate(plan.root)]
    assert steps == [
        f"import   {chat} (2 answers -> {plan.answers['chat']})",
        f"left     {code} (no manifest: its generation settings are unknown)",
    ]
    with answers.opened(plan.answers["chat"]) as store:
        assert len(store) == 2
        stored = store.get(answers.address([{"role": "user", "content": "Name a fruit."}]))
        assert stored["response"] == "answer to Name a fruit."
    assert answers.read(answers.file_of(plan.answers["chat"])).damaged == []
    # Looks before it acts: nothing new to import the second time.
    assert [s.action for s in migrate.migrate(plan.root)] == ["left"]


def write_per_mix_states(plan: Plan, samples: list[dict]) -> Path:
    """Hidden states as the code before states stores kept them: `hidden/<key of model, mix and
    settings>/` with shards whose rows name sample ids, and the stage's manifest."""
    import torch

    from draftsmith.formats.shards.writer import ShardWriter

    upstream = {"model": plan.model.key, "merged": plan.merged.key}
    params = {**plan.states.params, "num_shards": 2}
    old = Artifact("hidden", params, upstream, plan.root / "hidden" / "0123456789abcdef", "0123456789abcdef")
    for s in range(2):
        name = f"shard-{s:05d}"
        with ShardWriter(
            old.directory, name, mode="raw", hidden_size=4, dtype="float32", meta={"shard": name}
        ) as w:
            for r in samples[s::2]:
                n = len(r["input_ids"])
                states = torch.arange(n * 16, dtype=torch.float32).reshape(n, 16) + s
                w.add(r["id"], r["input_ids"], r["loss_mask"], states[:, :12], states[:, 12:])
    (old.directory / "assignment.json").write_text("{}")
    manifest.write(old, old.directory / MANIFEST, [old.directory / "assignment.json"], {}, time.time())
    return old.directory


def test_per_mix_shards_are_linked_into_the_states_store_with_no_forward_pass(plan, tmp_path):
    from draftsmith.formats.shards.reader import ShardReader
    from draftsmith.fsutil import atomic
    from draftsmith.hidden import assign

    samples = [
        {
            "id": f"d-{i:06d}",
            "input_ids": list(range(i, i + 3 + i % 3)),
            "loss_mask": [0, 1, 1] + [1] * (i % 3),
        }
        for i in range(7)
    ]
    old = write_per_mix_states(plan, samples)
    steps = list(migrate.migrate(plan.root, dry_run=True))
    assert [s.action for s in steps if s.action == "link"] == ["link", "link"]
    assert not plan.states.directory.exists()  # the dry run took no step
    steps = list(migrate.migrate(plan.root))
    assert [s.action for s in steps] == ["link", "link"]
    store = plan.states.directory
    indexes = sorted(store.glob("shard-*.json"))
    assert len(indexes) == 2
    for index in indexes:
        reader = ShardReader(store, index.stem)
        original = ShardReader(old, json.loads(index.read_text())["meta"]["migrated_from"])
        assert reader.verify() == [] and reader.bin_path.stat().st_ino == original.bin_path.stat().st_ino
        for k, sample in enumerate(reader):
            assert sample.id == sample_address(sample.input_ids.numpy(), sample.loss_mask.numpy())
            assert sample.aux.equal(original[k].aux) and sample.final.equal(original[k].final)
        kept = list(atomic.read_jsonl(plan.shard_samples(index.stem)))
        assert shard_name([r["address"] for r in kept]) == index.stem
    # A second run has nothing to do; the mix, planned now, forwards no token.
    assert list(migrate.migrate(plan.root)) == []
    merged = tmp_path / "train.jsonl"
    atomic.write_jsonl(merged, samples)
    view = assign.build(merged, store, num_shards=4)
    assert view["extract_tokens"] == 0 and view["new_shards"] == [] and view["stored_samples"] == 7
