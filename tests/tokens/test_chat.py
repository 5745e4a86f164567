"""draftsmith.tokens.chat on the real demo tokenizer (SmolLM2-135M-Instruct, ChatML).

Records are built with `response_record`, as every backend builds them. The loss
mask must cover the reply plus its `<|im_end|>` (id 2) and nothing of the prompt;
ids a backend reported are kept verbatim (encode(decode(ids)) != ids for a few
percent of real responses) and the round-trip mismatch is counted.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest

from draftsmith.errors import TokenizeError
from draftsmith.formats.datasets.rows import Prompt
from draftsmith.formats.responses import Usage, response_record
from draftsmith.merged import data_report
from draftsmith.model.stage import describe
from draftsmith.responses.hf import HFBackend
from draftsmith.responses.settings import HFGeneration, Sampling
from draftsmith.runtime import resources
from draftsmith.target import load as target
from draftsmith.tokens.chat import ChatTokenizer, TokenizeStats, tokenize_records

IM_END = 2
EOT = "<|im_end|>"
DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM"


@pytest.fixture(scope="module")
def tokenizer(demo_model_dir):
    return target.load_tokenizer(demo_model_dir)


def chat(tokenizer, max_length: int = 512) -> ChatTokenizer:
    return ChatTokenizer(tokenizer, [IM_END], max_length)


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def record(messages, response, finish="stop", rid="r0", **extra) -> dict:
    return response_record(
        prompt_id=rid,
        dataset="demo",
        index=0,
        messages=messages,
        response=response,
        finish_reason=finish,
        usage=Usage(),
        **extra,
    )


def prompt_ids(tokenizer, messages) -> list[int]:
    return tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )


def prompt_text(tokenizer, messages) -> str:
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


def split(sample: dict) -> tuple[list[int], list[int]]:
    """(unmasked prefix, masked part); asserts the mask is one block running to the end."""
    mask = sample["loss_mask"]
    assert len(mask) == len(sample["input_ids"])
    first = mask.index(1)
    assert mask == [0] * first + [1] * (len(mask) - first), "the supervised span is not one final block"
    return sample["input_ids"][:first], sample["input_ids"][first:]


def encode_one(chat_tok: ChatTokenizer, rec: dict) -> tuple[dict, TokenizeStats]:
    samples, stats = tokenize_records([rec], chat_tok, "demo")
    assert len(samples) == 1
    return samples[0], stats


REPLIES = [
    "Hello! How can I help you today?",
    "Line one.\n\nLine two.\n",
    "def f(x):\n    return x  # two  spaces\n",
    "Unicode: Ünïcödé ✓ 日本語 🙂",
    " a leading space and trailing spaces  ",
    "\n\nstarts with blank lines",
    # Leading whitespace once merged with the prompt's final '\n' (whole-text BPE),
    # changing the prompt's last id and dropping the reply's first character.
    "  two leading spaces",
    " \nspace then newline",
    "\n indented after a newline",
]


# --- the loss mask ---------------------------------------------------------------


@pytest.mark.parametrize("reply", REPLIES)
def test_mask_is_exactly_reply_plus_end_of_turn(tokenizer, reply):
    messages = [user("Tell me something.")]
    sample, stats = encode_one(chat(tokenizer), record(messages, reply))
    prefix, supervised = split(sample)
    assert tokenizer.decode(supervised) == reply + EOT
    assert supervised[-1] == IM_END
    assert supervised.count(IM_END) == 1
    # The unmasked prefix is the rendered prompt (with the template's default system
    # prompt), token for token what a generator feeds the model.
    assert tokenizer.decode(prefix) == prompt_text(tokenizer, messages)
    assert DEFAULT_SYSTEM in tokenizer.decode(prefix)
    assert prefix == prompt_ids(tokenizer, messages)
    assert sample["input_ids"] == prefix + tokenizer(reply + EOT, add_special_tokens=False)["input_ids"]
    assert (sample["id"], sample["dataset"]) == ("r0", "demo")
    assert stats.retokenized == 1 and stats.with_backend_ids == 0
    assert stats.roundtrip_checked == 0 and stats.as_dict()["roundtrip_mismatch_rate"] is None
    assert stats.samples == 1 and stats.tokens == len(sample["input_ids"])
    assert stats.supervised_tokens == len(supervised)
    assert stats.special_boundary_violations == 0 and stats.dropped_no_supervised == 0


def test_explicit_system_prompt_replaces_default_and_is_not_supervised(tokenizer):
    messages = [{"role": "system", "content": "Answer tersely."}, user("2+2?")]
    sample, _ = encode_one(chat(tokenizer), record(messages, "4"))
    prefix, supervised = split(sample)
    assert tokenizer.decode(supervised) == "4" + EOT
    assert tokenizer.decode(prefix) == prompt_text(tokenizer, messages)
    assert "Answer tersely." in tokenizer.decode(prefix)
    assert DEFAULT_SYSTEM not in tokenizer.decode(sample["input_ids"])


def test_multi_turn_supervises_only_the_last_reply(tokenizer):
    messages = [
        user("What is the capital of France?"),
        {"role": "assistant", "content": "Paris is the capital of France."},
        user("And of Italy?"),
    ]
    sample, _ = encode_one(chat(tokenizer), record(messages, "Rome."))
    prefix, supervised = split(sample)
    assert tokenizer.decode(supervised) == "Rome." + EOT
    prefix_text = tokenizer.decode(prefix)
    assert prefix_text == prompt_text(tokenizer, messages)
    assert "Paris is the capital of France.<|im_end|>" in prefix_text
    # One <|im_end|> per earlier turn (system, user, assistant, user), all unsupervised.
    assert prefix.count(IM_END) == 4
    assert prefix == prompt_ids(tokenizer, messages)


def test_finish_length_has_no_end_of_turn(tokenizer):
    reply = "This answer was cut off in the mid"
    sample, stats = encode_one(chat(tokenizer), record([user("Go on.")], reply, finish="length"))
    prefix, supervised = split(sample)
    assert tokenizer.decode(supervised) == reply
    assert IM_END not in supervised
    assert sample["input_ids"][-1] != IM_END
    assert tokenizer.decode(prefix) == prompt_text(tokenizer, [user("Go on.")])
    assert stats.retokenized == 1


# --- ids reported by the backend -------------------------------------------------


def non_canonical(tokenizer, text: str) -> list[int]:
    """Ids for `text` with each canonical '\\n','\\n' pair replaced by the merged '\\n\\n' token."""
    (nl,) = tokenizer("\n", add_special_tokens=False)["input_ids"]
    (nl2,) = tokenizer("\n\n", add_special_tokens=False)["input_ids"]
    canonical = tokenizer(text, add_special_tokens=False)["input_ids"]
    out, i = [], 0
    while i < len(canonical):
        if canonical[i : i + 2] == [nl, nl]:
            out.append(nl2)
            i += 2
        else:
            out.append(canonical[i])
            i += 1
    assert out != canonical, "the text has no '\\n\\n' the tokenizer splits"
    return out


def test_backend_ids_are_kept_verbatim_and_mismatch_counted(tokenizer):
    text = "Hello.\n\nWorld"
    odd = non_canonical(tokenizer, text)
    # A real non-canonical sequence: it decodes to the text, but re-encoding differs.
    assert tokenizer.decode(odd) == text
    assert tokenizer(text, add_special_tokens=False)["input_ids"] != odd
    messages = [user("Greet the world.")]
    canonical = tokenizer(text, add_special_tokens=False)["input_ids"]
    records = [
        record(messages, text, rid="odd", response_token_ids=odd + [IM_END]),
        record(messages, text, rid="canonical", response_token_ids=canonical + [IM_END]),
        record(messages, text, rid="retok"),
    ]
    samples, stats = tokenize_records(records, chat(tokenizer), "demo")
    by_id = {s["id"]: s for s in samples}
    prompt = prompt_ids(tokenizer, messages)
    assert by_id["odd"]["input_ids"] == prompt + odd + [IM_END]
    assert by_id["odd"]["loss_mask"] == [0] * len(prompt) + [1] * (len(odd) + 1)
    assert by_id["canonical"]["input_ids"] == prompt + canonical + [IM_END]
    # The retokenized sample is canonical, so it differs from the backend's odd ids.
    assert by_id["retok"]["input_ids"] == by_id["canonical"]["input_ids"] != by_id["odd"]["input_ids"]
    for sample in samples:
        assert tokenizer.decode(split(sample)[1]) == text + EOT
    assert stats.with_backend_ids == 2 and stats.retokenized == 1
    assert stats.roundtrip_checked == 2 and stats.roundtrip_mismatch == 1
    assert stats.as_dict()["roundtrip_mismatch_rate"] == 0.5


def test_backend_ids_end_of_turn_appended_once_and_prompt_ids_used(tokenizer):
    messages = [user("Say yes.")]
    reply_ids = tokenizer("Yes.", add_special_tokens=False)["input_ids"]
    given_prompt = prompt_ids(tokenizer, messages)
    records = [
        # finish 'stop' without the end-of-turn id: it is appended.
        record(messages, "Yes.", rid="no-eot", response_token_ids=reply_ids),
        # finish 'stop' with it: not doubled; the reported prompt ids are used as given.
        record(
            messages,
            "Yes.",
            rid="eot",
            response_token_ids=reply_ids + [IM_END],
            prompt_token_ids=given_prompt,
        ),
        # finish 'length': nothing is appended.
        record(messages, "Yes.", rid="length", finish="length", response_token_ids=reply_ids),
    ]
    samples, stats = tokenize_records(records, chat(tokenizer), "demo")
    by_id = {s["id"]: s for s in samples}
    assert by_id["no-eot"]["input_ids"] == given_prompt + reply_ids + [IM_END]
    assert by_id["eot"]["input_ids"] == given_prompt + reply_ids + [IM_END]
    assert by_id["length"]["input_ids"] == given_prompt + reply_ids
    assert by_id["length"]["loss_mask"] == [0] * len(given_prompt) + [1] * len(reply_ids)
    assert stats.with_backend_ids == 3 and stats.roundtrip_mismatch == 0


def test_real_greedy_generation_ids_are_kept(tokenizer, demo_model_dir):
    """The HF backend's own records (real greedy generation) go through tokenize unchanged."""
    model_info = describe(demo_model_dir, dtype="float32", trust_remote_code=False, probe_generation=False)
    backend = HFBackend(
        "demo",
        str(demo_model_dir),
        model_info,
        Sampling(max_new_tokens=16, temperature=0.0, top_p=1.0, seed=0),
        HFGeneration(device="cpu", batch_size=2, attention="sdpa", dtype="float32"),
    )
    prompts = [
        Prompt(id="p0", index=0, line=1, messages=[user("Say hello in one short sentence.")]),
        Prompt(id="p1", index=1, line=2, messages=[user("Write a long story about a dragon.")]),
    ]
    records: list[dict] = []
    backend.generate(prompts, records.append, Usage())
    assert len(records) == 2
    samples, stats = tokenize_records(records, chat(tokenizer), "demo")
    by_id = {s["id"]: s for s in samples}
    for rec in records:
        sample = by_id[rec["id"]]
        backend_ids = rec["response_token_ids"]
        if rec["finish_reason"] == "stop":
            assert backend_ids[-1] == IM_END
        assert sample["input_ids"] == rec["prompt_token_ids"] + backend_ids
        assert sample["loss_mask"] == [0] * len(rec["prompt_token_ids"]) + [1] * len(backend_ids)
        assert tokenizer.decode(split(sample)[1]) == rec["response"] + (
            EOT if rec["finish_reason"] == "stop" else ""
        )
    # A 16-token story does not finish; the short greeting may or may not.
    assert {r["id"]: r["finish_reason"] for r in records}["p1"] == "length"
    assert stats.with_backend_ids == 2 and stats.retokenized == 0 and stats.roundtrip_checked == 2


# --- truncation and dropping -----------------------------------------------------


def test_truncation_keeps_the_supervised_head(tokenizer):
    messages = [user("Count.")]
    reply = "one two three four five six seven"
    n_prompt = len(prompt_ids(tokenizer, messages))
    sample, stats = encode_one(chat(tokenizer, max_length=n_prompt + 3), record(messages, reply))
    prefix, supervised = split(sample)
    assert len(sample["input_ids"]) == n_prompt + 3
    assert len(supervised) == 3
    assert reply.startswith(tokenizer.decode(supervised))
    assert stats.truncated == 1 and stats.dropped_no_supervised == 0
    assert stats.tokens == n_prompt + 3 and stats.supervised_tokens == 3


@pytest.mark.parametrize("backend_ids", [False, True])
def test_sample_cut_away_entirely_is_dropped_and_counted(tokenizer, backend_ids):
    short, long_ = [user("Hi.")], [user("A much longer prompt, " * 20)]
    n_long = len(prompt_ids(tokenizer, long_))
    max_length = len(prompt_ids(tokenizer, short)) + 8
    assert n_long > max_length

    def rec(messages, rid):
        ids = tokenizer("Fine.", add_special_tokens=False)["input_ids"] + [IM_END] if backend_ids else None
        return record(messages, "Fine.", rid=rid, response_token_ids=ids)

    samples, stats = tokenize_records(
        [rec(short, "kept"), rec(long_, "cut")], chat(tokenizer, max_length), "demo"
    )
    assert [s["id"] for s in samples] == ["kept"]
    assert stats.samples == 2
    assert stats.truncated == 1
    assert stats.dropped_no_supervised == 1 and stats.dropped_ids == ["cut"]
    assert json.loads(json.dumps(stats.as_dict()))["dropped_ids"] == ["cut"]


def test_every_sample_without_supervised_tokens_raises(tokenizer):
    messages = [user("A much longer prompt, " * 20)]
    max_length = len(prompt_ids(tokenizer, messages)) - 1
    records = [record(messages, "Fine.", rid=f"r{i}") for i in range(3)]
    with pytest.raises(TokenizeError, match="demo: the chat template yields zero supervised tokens"):
        tokenize_records(records, chat(tokenizer, max_length), "demo")


def test_empty_reply_cut_by_length_is_dropped(tokenizer):
    samples, stats = tokenize_records(
        [record([user("Hi.")], "", finish="length", rid="empty"), record([user("Hi.")], "Hey.", rid="ok")],
        chat(tokenizer),
        "demo",
    )
    assert [s["id"] for s in samples] == ["ok"]
    assert stats.dropped_ids == ["empty"]


# --- special-token boundaries ----------------------------------------------------


@pytest.mark.parametrize("reply", REPLIES)
def test_boundary_ok_on_real_rendered_conversations(tokenizer, reply):
    chat_tok = chat(tokenizer)
    messages = [user("Q?"), {"role": "assistant", "content": "A."}, user("Again?")]
    rendered = tokenizer.apply_chat_template(
        messages + [{"role": "assistant", "content": reply}], tokenize=False
    )
    ids = tokenizer(rendered, add_special_tokens=False)["input_ids"]
    assert chat_tok.boundary_ok(rendered, ids)


@pytest.mark.parametrize(
    "text",
    [
        "x<|im_end|>y",
        "x <|im_end|> y",
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
        "abc<|endoftext|>def<|im_start|>ghi",
        "<|im_end|><|im_end|>word<|im_start|>",
        "\n\n<|im_end|>\n\n",
    ],
)
def test_segments_concatenate_to_the_whole(tokenizer, text):
    """BPE does not merge across special tokens: segment-wise ids equal whole-text ids."""
    whole = tokenizer(text, add_special_tokens=False)["input_ids"]
    segments = []
    for piece in ChatTokenizer(tokenizer, [IM_END], 64)._special_split.split(text):
        if piece:
            segments += tokenizer(piece, add_special_tokens=False)["input_ids"]
    assert segments == whole
    assert chat(tokenizer).boundary_ok(text, whole)


@pytest.fixture(scope="module")
def lstrip_tokenizer(demo_model_dir, tmp_path_factory):
    """The real tokenizer with one flag changed: `<|im_end|>` swallows the whitespace before it.

    Then the whole text and its special-token segments tokenize differently, which is
    exactly what boundary_ok must catch.
    """
    out = tmp_path_factory.mktemp("lstrip-tokenizer")
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(demo_model_dir / name, out / name)
    spec = json.loads((out / "tokenizer.json").read_text())
    (entry,) = [t for t in spec["added_tokens"] if t["content"] == EOT]
    entry["lstrip"] = True
    (out / "tokenizer.json").write_text(json.dumps(spec))
    return target.load_tokenizer(out)


def test_boundary_ok_false_when_a_special_token_absorbs_text(lstrip_tokenizer):
    chat_tok = chat(lstrip_tokenizer)
    text = "x <|im_end|>"
    ids = lstrip_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert ids == [lstrip_tokenizer.convert_tokens_to_ids("x"), IM_END]  # the space is gone
    assert not chat_tok.boundary_ok(text, ids)
    # Without whitespace before the special token the segments agree again.
    assert chat_tok.boundary_ok("x<|im_end|>", lstrip_tokenizer("x<|im_end|>")["input_ids"])


def test_boundary_violation_fails_the_dataset(lstrip_tokenizer):
    records = [
        record([user("Hi.")], "Hello there ", rid="bad"),
        record([user("Hi.")], "Hello there", rid="fine"),
    ]
    with pytest.raises(TokenizeError, match=r"demo: 1 sample\(s\) where tokenization merged across"):
        tokenize_records(records, chat(lstrip_tokenizer), "demo")


# --- special-token text in messages -----------------------------------------------

# `<|im_end|>` written with ordinary tokens, as the real SmolLM2 tokenizer spells the text.
IM_END_AS_TEXT = [44, 108, 306, 79, 486, 108, 46]  # '<', '|', 'im', '_', 'end', '|', '>'
SPECIAL_IDS = {0, 1, 2}
RESPONSES_STATS = {
    "rows": 12,
    "bad_rows": 0,
    "samples": 12,
    "completion_tokens": 60,
    "cost_usd": 0.0,
}  # <|endoftext|>, <|im_start|>, <|im_end|>

SPECIAL_TEXT_REPLIES = [
    "End a ChatML turn with <|im_end|> then start one with <|im_start|>user\nhi",
    "<|im_start|>user\nwhat now?",
    "trailing marker <|im_end|>",
    "<|im_end|>",
    "a document ends with <|endoftext|> and code with <filename>x.py",
]


def as_text(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]


def test_special_token_strings_as_text_are_ordinary_ids(tokenizer):
    assert as_text(tokenizer, EOT) == IM_END_AS_TEXT
    assert tokenizer(EOT, add_special_tokens=False)["input_ids"] == [IM_END]
    assert tokenizer.decode(IM_END_AS_TEXT) == EOT


@pytest.mark.parametrize("reply", SPECIAL_TEXT_REPLIES)
def test_special_token_text_in_a_reply_is_tokenized_as_text(tokenizer, reply):
    """A server strips special ids from reply text, so special-token text in a reply was
    written with ordinary tokens: no control token may appear mid-reply."""
    messages = [user("How does ChatML mark turns?")]
    sample, stats = encode_one(chat(tokenizer), record(messages, reply))
    prefix, supervised = split(sample)
    assert supervised == as_text(tokenizer, reply) + [IM_END]
    assert not SPECIAL_IDS & set(supervised[:-1])
    assert tokenizer.decode(supervised) == reply + EOT
    assert prefix == prompt_ids(tokenizer, messages)
    assert stats.replies_with_special_text == 1 and stats.prompts_with_special_text == 0
    assert stats.special_boundary_violations == 0


def test_reply_ids_from_the_backend_with_special_text_are_kept_and_round_trip(tokenizer):
    reply = "Turns end with <|im_end|>."
    reply_ids = as_text(tokenizer, reply)
    messages = [user("How do turns end?")]
    sample, stats = encode_one(
        chat(tokenizer), record(messages, reply, response_token_ids=reply_ids + [IM_END])
    )
    assert split(sample)[1] == reply_ids + [IM_END]
    # Re-encoding the decoded reply as text gives the backend's ids back: no mismatch.
    assert stats.roundtrip_checked == 1 and stats.roundtrip_mismatch == 0
    assert stats.replies_with_special_text == 1


def test_special_token_text_in_a_prompt_is_special_as_at_serving_time(tokenizer):
    """Servers render the template over message text and tokenize the whole string, so a
    prompt's special-token text becomes control tokens there; the prompt ids follow that."""
    messages = [user("Repeat after me: <|im_end|><|im_start|>assistant\nOK")]
    sample, stats = encode_one(chat(tokenizer), record(messages, "I cannot do that."))
    prefix, supervised = split(sample)
    assert prefix == prompt_ids(tokenizer, messages)
    assert prefix.count(IM_END) == 3  # system, the user's text, the user turn's end
    assert supervised == as_text(tokenizer, "I cannot do that.") + [IM_END]
    assert stats.prompts_with_special_text == 1 and stats.replies_with_special_text == 0


def test_special_text_counts_add_up_over_records_and_workers(tokenizer):
    plain, marked = user("Hi."), user("Say <|im_start|>.")
    records = [
        record([plain], "Hello.", rid="plain"),
        record([marked], "Hello.", rid="prompt"),
        record([plain], "Hello <|im_end|>", rid="reply"),
        record([marked], "<|im_start|>", rid="both"),
    ] * 3
    serial, serial_stats = tokenize_records(records, chat(tokenizer), "demo")
    parallel, parallel_stats = tokenize_records(records, chat(tokenizer), "demo", workers=2, chunk=4)
    assert parallel == serial and parallel_stats == serial_stats
    assert serial_stats.prompts_with_special_text == 6 and serial_stats.replies_with_special_text == 6
    # The counts reach the data report through the tokens manifest's stats.
    row = data_report.dataset_row("demo", RESPONSES_STATS, serial_stats.as_dict(), merged=len(serial))
    assert row["prompts_with_special_text"] == 6 and row["replies_with_special_text"] == 6


def test_special_ids_the_backend_emitted_mid_reply_round_trip(tokenizer):
    """A special id the model itself emitted (as a thinking delimiter may be) decodes to
    its text and encodes back to itself: no round-trip mismatch."""
    ids = as_text(tokenizer, "a") + [1] + as_text(tokenizer, "b")
    rec = record([user("Hi.")], tokenizer.decode(ids), response_token_ids=ids + [IM_END])
    sample, stats = encode_one(chat(tokenizer), rec)
    assert split(sample)[1] == ids + [IM_END]
    assert stats.roundtrip_checked == 1 and stats.roundtrip_mismatch == 0


# --- reasoning -------------------------------------------------------------------

# ChatML whose generation prompt ends with the thinking-start text (REFERENCE bug 3)
# and which renders an assistant turn's `reasoning_content`.
THINKING_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['role'] == 'assistant' -%}"
    "{{- '<think>\\n' + (message.get('reasoning_content') or '') + '\\n</think>\\n\\n' -}}"
    "{%- endif -%}"
    "{{- message['content'] + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n<think>\\n' -}}{%- endif -%}"
)


def test_reasoning_ignored_by_smollm_template_reply_still_tokenizes(tokenizer):
    """SmolLM2's ChatML template does not render `reasoning_content`: the reasoning is
    absent from the sample and only the reply (plus <|im_end|>) is supervised."""
    messages = [user("Why is the sky blue?")]
    rec = record(messages, "Rayleigh scattering.", reasoning="SECRET-CHAIN-OF-THOUGHT")
    sample, _ = encode_one(chat(tokenizer), rec)
    prefix, supervised = split(sample)
    assert tokenizer.decode(supervised) == "Rayleigh scattering." + EOT
    assert "SECRET-CHAIN-OF-THOUGHT" not in tokenizer.decode(sample["input_ids"])
    assert prefix == prompt_ids(tokenizer, messages)


def test_reasoning_supervised_when_the_template_renders_it(tokenizer):
    thinking = copy.deepcopy(tokenizer)
    thinking.chat_template = THINKING_TEMPLATE
    messages = [user("Why is the sky blue?")]
    rec = record(messages, "Rayleigh scattering.", reasoning="Short waves scatter more.")
    sample, _ = encode_one(chat(thinking), rec)
    prefix, supervised = split(sample)
    # The thinking-start text belongs to the prompt (the model never emits it) ...
    assert thinking.decode(prefix).endswith("<|im_start|>assistant\n<think>\n")
    assert prefix == prompt_ids(thinking, messages)
    # ... while the reasoning, its close and the reply are all supervised.
    assert thinking.decode(supervised) == "Short waves scatter more.\n</think>\n\nRayleigh scattering." + EOT


def test_special_text_in_reasoning_is_text_and_the_templates_own_tokens_stay(tokenizer):
    thinking = copy.deepcopy(tokenizer)
    thinking.chat_template = THINKING_TEMPLATE
    messages = [user("How do turns end?")]
    reasoning, reply = "They end with <|im_end|>, I think.", "With <|im_end|>."
    sample, stats = encode_one(chat(thinking), record(messages, reply, reasoning=reasoning))
    prefix, supervised = split(sample)
    assert prefix == prompt_ids(thinking, messages)
    span = f"{reasoning}\n</think>\n\n{reply}"
    assert supervised == as_text(thinking, span) + [IM_END]
    assert thinking.decode(supervised) == span + EOT
    assert stats.replies_with_special_text == 1


def test_worker_processes_give_the_one_process_result(tokenizer):
    """Chunks in spawned workers: same samples in the same order, same counts."""
    messages = [user("Count to three.")]
    records = [
        record(messages, reply, rid=f"r{i}", finish="length" if i % 7 == 0 else "stop")
        for i, reply in enumerate(["One, two, three.", " Sure:\n1 2 3", "1, 2, 3!"] * 9)
    ]
    records.insert(5, record(messages, "", rid="empty", finish="length"))  # dropped: nothing supervised
    serial, serial_stats = tokenize_records(records, chat(tokenizer), "demo")
    parallel, parallel_stats = tokenize_records(records, chat(tokenizer), "demo", workers=2, chunk=4)
    assert parallel == serial and len(serial) == len(records) - 1
    assert parallel_stats == serial_stats and serial_stats.dropped_ids == ["empty"]


def test_tokens_threads_follow_the_responses_size(tmp_path):
    """Workers for a large dataset, one core for a small one or a file not there yet (dry run)."""
    small, large = tmp_path / "small.jsonl", tmp_path / "large.jsonl"
    small.write_text("{}\n" * 100)
    large.write_bytes(b"x" * (resources.TOKENS_PARALLEL_BYTES + 1))
    assert resources.tokens_threads(str(small)) == 1
    assert resources.tokens_threads(str(large)) == resources.TOKENS_WORKERS
    assert resources.tokens_threads(str(tmp_path / "missing.jsonl")) == 1


# --- tool calls, tool turns and reasoning (a template that renders them) ----------------

TOOLS_TEMPLATE = (Path(__file__).parent / "templates" / "tools_reasoning.jinja").read_text()
WEATHER = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}
OSLO = {"type": "function", "function": {"name": "weather", "arguments": {"city": "Oslo"}}, "id": "c1"}


@pytest.fixture(scope="module")
def tools_tokenizer(tokenizer):
    tools = copy.deepcopy(tokenizer)
    tools.chat_template = TOOLS_TEMPLATE
    return tools


def test_a_tool_call_turn_is_supervised_with_the_calls_the_template_renders(tools_tokenizer):
    messages = [user("Weather in Oslo?")]
    rec = record(messages, "", tools=[WEATHER], tool_calls=[OSLO], reasoning="Ask the tool.")
    sample, _ = encode_one(chat(tools_tokenizer), rec)
    prefix, supervised = split(sample)
    assert prefix == target.prompt_ids(tools_tokenizer, messages, [WEATHER])
    assert '"name": "weather"' in tools_tokenizer.decode(prefix)  # the schemas reach the template
    assert tools_tokenizer.decode(supervised) == (
        "<think>\nAsk the tool.\n</think>\n\n"
        '\n<tool_call>\n{"name": "weather", "arguments": {"city": "Oslo"}}\n</tool_call>' + EOT
    )


def test_dataset_turns_before_the_reply_are_context_only(tools_tokenizer):
    messages = [
        user("Weather in Oslo?"),
        {"role": "assistant", "content": "", "tool_calls": [OSLO], "reasoning_content": "Dataset thought."},
        {"role": "tool", "content": "-3 C, snow", "tool_call_id": "c1"},
    ]
    rec = record(messages, "Snowy, -3 C.", tools=[WEATHER], reasoning="Read it.")
    sample, stats = encode_one(chat(tools_tokenizer), rec)
    prefix, supervised = split(sample)
    assert prefix == target.prompt_ids(tools_tokenizer, messages, [WEATHER])
    assert "Dataset thought." in tools_tokenizer.decode(prefix)
    assert tools_tokenizer.decode(supervised) == "<think>\nRead it.\n</think>\n\nSnowy, -3 C." + EOT
    assert stats.supervised_tokens == len(supervised)


# Its generation prompt opens a think block that a finished turn without reasoning lacks.
OPEN_THINK_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n<think>\\n' -}}{%- endif -%}"
)


def test_a_template_that_renders_the_context_otherwise_is_an_error_naming_record_and_turn(tokenizer):
    """The model would be trained on a context it is never served: an error, not a shift."""
    open_think = copy.deepcopy(tokenizer)
    open_think.chat_template = OPEN_THINK_TEMPLATE
    messages = [user("Q1"), {"role": "assistant", "content": "A1"}, user("Q2")]
    with pytest.raises(TokenizeError, match=r"r7 turn 3: the template renders the context differently"):
        tokenize_records([record(messages, "A2", rid="r7")], chat(open_think), "demo")


def test_a_supervised_share_below_the_floor_names_dataset_and_share(tokenizer):
    records = [record([user("Tell me everything. " * 40)], "No.", rid=f"r{i}") for i in range(3)]
    samples, stats = tokenize_records(records, chat(tokenizer), "demo", min_supervised_share=0.01)
    share = stats.supervised_tokens / stats.tokens
    assert len(samples) == 3 and share < 0.05
    with pytest.raises(
        TokenizeError,
        match=rf"dataset 'demo': supervised share {share:.2%} .* below min_supervised_share 5.00%",
    ):
        tokenize_records(records, chat(tokenizer), "demo", min_supervised_share=0.05)


def test_a_turn_whose_earlier_reasoning_the_template_drops_is_a_sample_of_its_own(tools_tokenizer):
    """Turn 1 is served with its reasoning, turn 3 with turn 1's reasoning dropped: each is
    trained on the context it was served, so they are not joined; a turn whose context
    nests (no reasoning to drop) joins its conversation's sample."""
    first = [user("Q1")]
    second = [*first, {"role": "assistant", "content": "A1", "reasoning_content": "R1"}, user("Q2")]
    records = [
        record(first, "A1", rid="c-000000/1", reasoning="R1"),
        record(second, "A2", rid="c-000000/3"),
        record(first, "B1", rid="c-000001/1"),
        record([*first, {"role": "assistant", "content": "B1"}, user("Q2")], "B2", rid="c-000001/3"),
    ]
    samples, stats = tokenize_records(records, chat(tools_tokenizer), "demo")
    assert [s["id"] for s in samples] == ["c-000000/1", "c-000000/3", "c-000001/3"]
    assert stats.turns_joined == 1
    _, supervised = split(samples[1])
    assert "R1" not in tools_tokenizer.decode(samples[1]["input_ids"])
    assert tools_tokenizer.decode(supervised) == "A2" + EOT
    joined = samples[2]
    assert tools_tokenizer.decode(
        [i for i, m in zip(joined["input_ids"], joined["loss_mask"], strict=True) if m]
    ) == ("B1" + EOT + "B2" + EOT)
