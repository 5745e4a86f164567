"""draftsmith.store.answers: where an answer is stored (generation key and address), the store
file's integrity, and what verify, verify --fix and gc do with it."""

from __future__ import annotations

import copy
import os
import threading
import time
from pathlib import Path

import pytest
import yaml
from conftest import stand_in_config

from draftsmith import cli
from draftsmith.formats.responses import Usage, response_record
from draftsmith.fsutil import atomic
from draftsmith.store import answers, gc, manifest, verify
from draftsmith.store.keys import answers_key
from draftsmith.store.layout import ANSWERS, ANSWERS_FILE
from draftsmith.store.plan import Plan
from draftsmith.workflow import configure

PAST = 1_000_000_000  # written long ago: outside any grace period


def messages(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def record(text: str, prompt_id: str = "chat-000000", index: int = 0) -> dict:
    return response_record(
        prompt_id=prompt_id,
        dataset="chat",
        index=index,
        messages=messages(text),
        response=f"answer to {text}",
        finish_reason="stop",
        usage=Usage(3, 4),
        response_token_ids=[5, 6, 2],
    )


def put(directory: Path, *texts: str) -> None:
    with answers.opened(directory) as store:
        for text in texts:
            store.put(record(text), answers.address(messages(text)))


def test_address_is_the_messages_content_only():
    first = [{"role": "user", "content": "Hi"}]
    reordered = [{"content": "Hi", "role": "user"}]
    assert answers.address(first) == answers.address(reordered)
    assert answers.address(first) != answers.address([{"role": "user", "content": "Hi "}])
    assert len(answers.address(first)) == 64


def test_tools_are_part_of_the_address_and_a_stored_answer_checks_them(tmp_path):
    tools = [{"type": "function", "function": {"name": "weather"}}]
    first = messages("Hi")
    assert answers.address(first, tools) != answers.address(first)
    assert answers.address(first, None) == answers.address(first, []) == answers.address(first)
    with_tools = record("Hi") | {"tools": tools}
    assert answers.problem(answers.stored(with_tools, answers.address(first, tools))) is None
    assert (
        answers.problem(answers.stored(with_tools, answers.address(first)))
        == "address is not its prompt's hash"
    )


def test_generation_key_hashes_model_and_semantic_settings(tmp_path):
    config = stand_in_config(tmp_path)
    plan = configure(copy.deepcopy(config)).plan
    # Two datasets with the same generation settings share one answer store.
    assert plan.answers["chat"] == plan.answers["code"]
    assert plan.answers["chat"].parent == plan.root / ANSWERS
    generation = plan.responses["chat"].params["generation"]
    assert plan.answers["chat"].name == answers_key(plan.model.key, generation)
    # A dataset's content, max_samples and prompt-length cap are not in it; a seed is.
    config["datasets"]["chat"]["max_samples"] = 1
    config["datasets"]["chat"]["max_prompt_tokens"] = 100
    assert configure(copy.deepcopy(config)).plan.answers["chat"] == plan.answers["chat"]
    config["generation"]["seed"] = 7  # fresh samples on purpose
    assert configure(copy.deepcopy(config)).plan.answers["chat"] != plan.answers["chat"]
    config["datasets"]["chat"]["generation"] = {"temperature": 0.7}
    sampled = configure(copy.deepcopy(config)).plan
    assert sampled.answers["chat"] != sampled.answers["code"]
    assert answers_key("a" * 16, generation) != answers_key("b" * 16, generation)


def test_an_answer_is_stored_once_with_its_hash_and_read_back_per_prompt(tmp_path):
    directory = tmp_path / ANSWERS / "0123456789abcdef"
    put(directory, "one", "two")
    with answers.opened(directory) as store:
        assert len(store) == 2
        at = answers.address(messages("one"))
        assert store.put(record("one"), at) is False  # already stored: nothing written
        back = answers.as_record(store.get(at), "code-000007", "code", 7)
    assert back == record("one", "code-000007", 7) | {"dataset": "code"}
    assert list(back) == list(record("one"))  # the record layout tokens reads
    lines = (directory / ANSWERS_FILE).read_text().splitlines()
    assert len(lines) == 2
    assert answers.read(directory / ANSWERS_FILE).damaged == []


def test_a_torn_tail_is_dropped_and_a_damaged_answer_refused(tmp_path):
    directory = tmp_path / ANSWERS / "0123456789abcdef"
    put(directory, "one", "two")
    path = directory / ANSWERS_FILE
    with open(path, "ab") as handle:
        handle.write(b'{"response": "cut sh')  # kill -9 mid-write
    with answers.opened(directory) as store:
        assert store.torn_lines == 1 and len(store) == 2
    assert path.read_bytes().endswith(b"}\n")

    path.write_text(path.read_text().replace("answer to one", "answer to 0ne"))
    with pytest.raises(answers.AnswerStoreDamaged, match=r"line 1: sha256 mismatch.*verify --fix"):
        answers.AnswerStore(directory)


def test_verify_finds_a_damaged_answer_and_fix_drops_only_it(tmp_path, capsys):
    root = tmp_path / "artifacts"
    directory = root / ANSWERS / "0123456789abcdef"
    put(directory, "one", "two", "three")
    assert verify.run(root, None, fix=False, configfiles=[]) == 0
    assert "3 stored answers checked, 0 corrupt" in capsys.readouterr().out

    path = directory / ANSWERS_FILE
    path.write_text(path.read_text().replace("answer to two", "answer to tw0"))
    assert verify.run(root, None, fix=False, configfiles=[]) == 1
    out = capsys.readouterr().out
    assert f"CORRUPT {path}\n  line 2: sha256 mismatch" in out and "verify --fix" in out
    assert "answer to tw0" in path.read_text()  # nothing changes without --fix

    assert verify.run(root, None, fix=True, configfiles=[]) == 1
    assert "dropped 1 answer(s); the next run generates only them again" in capsys.readouterr().out
    with answers.opened(directory) as store:
        assert sorted(a for a in ("one", "two", "three") if answers.address(messages(a)) in store) == [
            "one",
            "three",
        ]
    assert verify.run(root, None, fix=False, configfiles=[]) == 0


def built_responses(plan: Plan, dataset: str, texts: list[str]) -> None:
    """A finished responses artifact holding `texts` (what gc reads: its records and manifest)."""
    artifact = plan.responses[dataset]
    outputs = artifact.outputs
    atomic.write_jsonl(outputs["responses"], [record(t) for t in texts])
    atomic.write_jsonl(outputs["bad_rows"], [])
    manifest.write(
        artifact, outputs["manifest"], [outputs["responses"], outputs["bad_rows"]], {}, time.time()
    )


def test_gc_lists_and_deletes_only_answers_no_config_uses(tmp_path):
    plan = configure(stand_in_config(tmp_path)).plan
    store = plan.answers["chat"]
    retired = plan.root / ANSWERS / "fedcba9876543210"  # a generation key no config plans
    put(store, "kept by chat", "kept by code", "asked by nobody")
    put(retired, "old")

    # While a planned dataset is not built, the prompts it needs are unknown: all stay.
    built_responses(plan, "chat", ["kept by chat"])
    listed = {item.directory: item for item in gc.unused_answers([plan])}
    assert listed[store].kept is not None and "not built" in listed[store].kept
    assert listed[retired].whole and listed[retired].unused == {answers.address(messages("old"))}

    built_responses(plan, "code", ["kept by code"])
    for path in [*store.rglob("*"), *retired.rglob("*"), store, retired]:
        os.utime(path, (PAST, PAST))
    listed = {item.directory: item for item in gc.unused_answers([plan])}
    assert listed[store].unused == {answers.address(messages("asked by nobody"))}
    assert (
        listed[store].size
        == answers.read(store / ANSWERS_FILE).sizes[answers.address(messages("asked by nobody"))]
    )
    assert gc.answers_kept(listed[store], gc.DEFAULT_GRACE_S) is None

    for item in listed.values():
        assert gc.remove_answers(item, gc.DEFAULT_GRACE_S) is None
    assert not retired.exists()
    with answers.opened(store) as opened:
        assert len(opened) == 2 and answers.address(messages("asked by nobody")) not in opened
    assert [item.unused for item in gc.unused_answers([plan])] == [set()]


def test_gc_leaves_answers_written_within_the_grace_period_or_in_use(tmp_path):
    plan = configure(stand_in_config(tmp_path)).plan
    retired = plan.root / ANSWERS / "fedcba9876543210"
    put(retired, "old")
    (item,) = [i for i in gc.unused_answers([plan]) if i.directory == retired]
    assert "grace period" in gc.remove_answers(item, gc.DEFAULT_GRACE_S)
    with answers.opened(retired):
        assert "in use" in gc.remove_answers(item, 0)
    assert retired.exists()


def test_draftsmith_gc_lists_then_deletes_unused_answers(tmp_path, capsys):
    config = stand_in_config(tmp_path)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    plan = configure(copy.deepcopy(config)).plan
    retired = plan.root / ANSWERS / "fedcba9876543210"
    put(retired, "old", "older")
    for item in [*retired.rglob("*"), retired]:
        os.utime(item, (PAST, PAST))
    assert cli.main(["gc", "--configfile", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"{retired}: 2 answers, the whole store" in out
    assert "gc: 2 stored answers unused (delete with --delete)" in out
    assert retired.exists()
    assert cli.main(["gc", "--configfile", str(path), "--delete"]) == 0
    assert "gc: 2 stored answers deleted" in capsys.readouterr().out
    assert not retired.exists()


def test_a_second_job_waits_for_the_lock_then_finds_the_answer(tmp_path):
    directory = tmp_path / ANSWERS / "0123456789abcdef"
    at = answers.address(messages("one"))
    seen: list[bool] = []

    def second_job() -> None:
        with answers.opened(directory) as store:
            seen.append(at in store)

    with answers.opened(directory) as first:
        waiting = threading.Thread(target=second_job)
        waiting.start()
        time.sleep(0.5)
        assert waiting.is_alive() and seen == []  # it waits while the first job generates
        first.put(record("one"), at)
    waiting.join(10)
    assert seen == [True]  # and then finds the answer: nothing is requested twice
