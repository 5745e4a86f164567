"""draftsmith.responses.turns and `regenerate: every_turn`: every assistant turn written by
the target, tool results kept when its calls match the dataset's, resume per turn."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import openai_cfg
from fault_proxy import FaultProxy

from draftsmith.formats.datasets.rows import LoadedDataset, Prompt
from draftsmith.formats.responses import Usage, response_record
from draftsmith.model.stage import describe
from draftsmith.responses import stage, turns
from draftsmith.responses.hf import HFBackend, split_tool_calls
from draftsmith.responses.openai_api import OpenAIBackend
from draftsmith.responses.settings import HFGeneration, Sampling
from draftsmith.store import answers
from draftsmith.store.plan import Artifact
from draftsmith.target import load as target
from draftsmith.tokens.chat import ChatTokenizer, tokenize_records

WEATHER = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}
GENERATION = Sampling(max_new_tokens=6, temperature=0.0, top_p=1.0, seed=0)


def call(city: str, **extra) -> dict:
    return {"type": "function", "function": {"name": "weather", "arguments": {"city": city}}} | extra


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def tool_conversation(
    index: int = 0,
    ask: str = "Weather in Oslo?",
    city: str = "Oslo",
    result: str = "-3 C, snow",
    reply: str = "Snowy.",
) -> Prompt:
    """A dataset conversation: a question, the dataset's weather call and its result, a reply, thanks."""
    messages = [
        user(ask),
        {"role": "assistant", "content": "", "tool_calls": [call(city, id="d1")]},
        {"role": "tool", "content": result, "tool_call_id": "d1"},
        {"role": "assistant", "content": reply},
        user("Thanks."),
    ]
    return Prompt(f"conv-{index:06d}", index, index + 1, messages, [WEATHER])


def answer(prompt: Prompt, text: str, calls: list[dict] | None = None) -> dict:
    return response_record(
        prompt_id=prompt.id,
        dataset="conv",
        index=prompt.index,
        messages=prompt.messages,
        tools=prompt.tools,
        response=text,
        tool_calls=calls,
        finish_reason="stop",
        usage=Usage(1, 1),
    )


def store_answer(store: answers.AnswerStore, prompt: Prompt, text: str, calls=None) -> None:
    store.put(answer(prompt, text, calls), answers.address(prompt.messages, prompt.tools))


def test_calls_match_on_function_and_json_equal_arguments():
    assert turns.calls_match([call("Oslo", id="t1")], [call("Oslo", id="d1")])
    assert turns.calls_match(
        [call("Oslo")], [{"function": {"name": "weather", "arguments": {"city": "Oslo"}}}]
    )
    assert not turns.calls_match([call("Bergen")], [call("Oslo")])
    assert not turns.calls_match([call("Oslo"), call("Oslo")], [call("Oslo")])
    assert not turns.calls_match(None, [call("Oslo")]) and not turns.calls_match(None, None)


def test_hermes_style_calls_in_generated_text_become_structured_calls():
    text = 'Let me look.\n<tool_call>\n{"name": "weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    assert split_tool_calls(text) == ("Let me look.", [call("Oslo")])
    assert split_tool_calls("No call here.") == ("No call here.", None)
    broken = "<tool_call>\n{not json}\n</tool_call>"
    assert split_tool_calls(broken) == (broken, None)


def test_a_walk_stops_at_the_first_unanswered_turn_and_keeps_matching_tool_results(tmp_path):
    conversation = tool_conversation()
    with answers.opened(tmp_path / "answers" / "k") as store:
        first = turns.walk(conversation, store, "conv")
        assert first.records == [] and first.pending.messages == [user("Weather in Oslo?")]
        assert first.pending.id == "conv-000000/1" and first.pending.tools == [WEATHER]
        store_answer(store, first.pending, "", [call("Oslo", id="t1")])
        second = turns.walk(conversation, store, "conv")
        # The dataset's result answers the target's own call; the target's turn is context.
        assert second.pending.messages == [
            user("Weather in Oslo?"),
            {"role": "assistant", "content": "", "tool_calls": [call("Oslo", id="t1")]},
            {"role": "tool", "content": "-3 C, snow", "tool_call_id": "t1"},
        ]
        assert (second.calls_matched, second.ended_early, len(second.records)) == (1, False, 1)
        store_answer(store, second.pending, "Snow in Oslo.")
        third = turns.walk(conversation, store, "conv")
        assert third.pending.id == "conv-000000/5"  # the reply after the final user turn
        assert third.pending.messages[-2:] == [
            {"role": "assistant", "content": "Snow in Oslo."},
            user("Thanks."),
        ]


def test_a_call_unlike_the_datasets_ends_the_conversation_there(tmp_path):
    conversation = tool_conversation()
    with answers.opened(tmp_path / "answers" / "k") as store:
        store_answer(store, turns.walk(conversation, store, "conv").pending, "", [call("Bergen")])
        walked = turns.walk(conversation, store, "conv")
        assert (walked.pending, walked.ended_early, walked.calls_matched) == (None, True, 0)
        assert [r["id"] for r in walked.records] == ["conv-000000/1"]


def hf_backend(model_dir: Path, requests: list[int]):
    """The real hf backend, counting the prompts each round asks."""
    info = describe(model_dir, dtype="float32", trust_remote_code=False, probe_generation=False)
    hf = HFGeneration(device="cpu", batch_size=4, attention="sdpa", dtype="float32")

    def make() -> HFBackend:
        made = HFBackend("conv", str(model_dir), info, GENERATION, hf)
        generate = made.generate
        made.generate = lambda prompts, emit, spent: (
            requests.append(len(prompts)),
            generate(prompts, emit, spent),
        )
        return made

    return make


def run_every_turn(backend, tmp_path: Path, conversations: list[Prompt]) -> dict:
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    outputs = {name: str(out / f"{name}.jsonl") for name in ("responses", "bad_rows")}
    outputs["manifest"] = str(out / "manifest.json")
    artifact = Artifact("responses", {}, {}, out, "0" * 16, "conv")
    loaded = LoadedDataset("conv", conversations, [], len(conversations), 0)
    with answers.opened(tmp_path / "answers" / "k") as store:
        return stage.run(
            dataset="conv",
            loaded=loaded,
            backend=backend,
            artifact=artifact,
            store=store,
            outputs=outputs,
            openai=openai_cfg("http://unused"),  # its prices (0) cost the answers
            regenerate="every_turn",
        )


def test_every_turn_with_the_real_model_asks_each_turn_once_and_resumes_per_turn(tmp_path, tools_model_dir):
    plain = Prompt(
        "conv-000001", 1, 2, [user("Hi!"), {"role": "assistant", "content": "Hello."}, user("Name a colour.")]
    )
    requests: list[int] = []
    stats = run_every_turn(hf_backend(tools_model_dir, requests), tmp_path, [tool_conversation(), plain])
    # plain: 2 turns, the second after the target's own first reply. The tiny target makes no
    # call where the dataset made one, so that conversation ends after its first turn.
    assert (stats["conversations"], stats["regenerated_turns"], stats["ended_early"]) == (2, 3, 1)
    assert stats["answers_generated"] == stats["regenerated_turns"] == sum(requests) == 3
    records = [
        json.loads(line) for line in Path(tmp_path / "out" / "responses.jsonl").read_text().splitlines()
    ]
    assert [r["id"] for r in records] == ["conv-000000/1", "conv-000001/1", "conv-000001/3"]
    first, second = records[1], records[2]
    assert second["messages"][1] == {"role": "assistant", "content": first["response"]}
    assert records[0]["tools"] == [WEATHER]

    # A kill before the last turn was stored: the rerun asks that turn only.
    store_file = tmp_path / "answers" / "k" / "answers.jsonl"
    lines = store_file.read_text().splitlines(keepends=True)
    store_file.write_text("".join(lines[:-1]))
    requests.clear()
    again = run_every_turn(hf_backend(tools_model_dir, requests), tmp_path, [tool_conversation(), plain])
    assert (again["answers_generated"], again["answers_reused"], requests) == (1, 2, [1])
    assert (
        json.loads(Path(tmp_path / "out" / "responses.jsonl").read_text().splitlines()[2])["id"]
        == "conv-000001/3"
    )
    requests.clear()
    assert (
        run_every_turn(hf_backend(tools_model_dir, requests), tmp_path, [tool_conversation(), plain])[
            "answers_generated"
        ]
        == 0
    )
    assert requests == []

    # Both turns of the plain conversation train in one sample: its ids nest.
    tokenizer = target.load_tokenizer(tools_model_dir)
    samples, token_stats = tokenize_records(records, ChatTokenizer(tokenizer, [2], 512), "conv")
    assert [s["id"] for s in samples] == ["conv-000000/1", "conv-000001/3"] and token_stats.turns_joined == 1
    first_context, joined = first["prompt_token_ids"], samples[1]
    assert joined["input_ids"] == second["prompt_token_ids"] + second["response_token_ids"]
    assert joined["input_ids"][: len(first_context)] == first_context
    first_turn = slice(len(first_context), len(first_context) + len(first["response_token_ids"]))
    assert all(joined["loss_mask"][first_turn])
    assert sum(joined["loss_mask"]) == len(first["response_token_ids"]) + len(second["response_token_ids"])
    assert token_stats.tokens == sum(len(s["input_ids"]) for s in samples)


def test_matching_calls_keep_the_datasets_results_through_an_openai_server(tmp_path):
    """The canned server calls weather(Bergen) for a user turn "call: weather Bergen"."""
    conversation = tool_conversation(0, "call: weather Bergen", "Bergen", "rain", "Rain in Bergen.")
    with FaultProxy() as proxy:
        cfg = openai_cfg(proxy.url)
        stats = run_every_turn(lambda: OpenAIBackend("conv", cfg, GENERATION, "m"), tmp_path, [conversation])
        bodies = proxy.bodies
    # Turn 1 matched the dataset's call, so turn 3 sees the dataset's result answering the
    # target's own call id; there the canned server calls again where the dataset replied.
    assert (stats["tool_calls_matched"], stats["ended_early"], stats["regenerated_turns"]) == (1, 1, 2)
    assert len(bodies) == stats["answers_generated"] == 2
    assert bodies[1]["messages"][1]["tool_calls"][0]["id"] == "call_0"
    assert bodies[1]["messages"][2] == {"role": "tool", "content": "rain", "tool_call_id": "call_0"}
    assert all(body["tools"] == [WEATHER] for body in bodies)
