"""The built-in evaluator on the real demo model: greedy and speculative decoding, the
draft's inference path against its training-time math, losslessness, prompt overlap and
the benchmark files."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import write_rows, write_training

from draftsmith import config as cfg
from draftsmith.draft import vocab
from draftsmith.draft.model import DraftConfig, Eagle3Draft, shift
from draftsmith.evaluate import spec_decode as sd
from draftsmith.evaluate import tree_decode as td
from draftsmith.evaluate.launch import recommend, sglang_launch
from draftsmith.evaluate.measure import (
    EvaluationError,
    LosslessError,
    Settings,
    _acceptance,
    benchmark_sets,
    section_key,
    vocab_coverage,
)
from draftsmith.evaluate.stage import evaluate, export_aux_layers
from draftsmith.export.load import load_sglang_export
from draftsmith.export.write import export_sglang
from draftsmith.formats.datasets.rows import Prompt
from draftsmith.formats.prompt_sets import (
    EvalPrompt,
    OverlapError,
    check_overlap,
    load_prompt_set,
    prompt_hash,
    training_prompts,
)
from draftsmith.fsutil import atomic
from draftsmith.model.stage import describe
from draftsmith.speculation import Speculation
from draftsmith.store.journal import Journal
from draftsmith.store.plan import plan_for
from draftsmith.target import load as target
from draftsmith.target import special_tokens
from draftsmith.target.layers import AuxLayers
from draftsmith.workflow import configure

REPO = Path(__file__).resolve().parents[2]
# The first makes the target repeat ", hello": with a two-token draft vocabulary of
# exactly those, a random draft is often right, so rounds that accept (crop less, add
# several draft positions) get exercised; the second is accepted rarely.
PROMPTS = ["Repeat the word hello ten times.", "Name three colours of the rainbow."]
REPEATED = [28, 33662]  # "," and " hello" in the demo vocabulary
MAX_NEW = 20
TREE = {"num_steps": 2, "topk": 2, "num_draft_tokens": 4}  # topk <= the exported draft's 2 tokens
MODEL_CFG = {"dtype": "float32", "trust_remote_code": False, "probe_generation": False}


@pytest.fixture(scope="module")
def model(demo_model_dir):
    return target.load_model(demo_model_dir, "float32")


@pytest.fixture(scope="module")
def model_info(demo_model_dir) -> dict:
    return describe(demo_model_dir, **MODEL_CFG)


@pytest.fixture(scope="module")
def stops(model_info) -> list[int]:
    return special_tokens.stop_ids(model_info)


@pytest.fixture(scope="module")
def heldout(tmp_path_factory, demo_model_dir) -> list[EvalPrompt]:
    path = tmp_path_factory.mktemp("sets") / "tiny.jsonl"
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    entry = {"path": str(path), "format": "prompt", "prompt_field": "prompt", "max_prompts": None}
    return load_prompt_set("tiny", entry, target.load_tokenizer(demo_model_dir), None)


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory, demo_model_dir, model) -> Path:
    """A randomly initialised draft of the demo target's shapes, exported for SGLang."""
    torch.manual_seed(0)
    text = model.config.get_text_config()
    config = DraftConfig.from_target(text, draft_vocab_size=len(REPEATED), max_position_embeddings=8192)
    draft = Eagle3Draft(config, model.get_input_embeddings().weight.detach())
    mapping = vocab.build({t: 1 for t in REPEATED}, len(REPEATED), config.vocab_size)
    draft.set_vocab(mapping["d2t"], mapping["t2d"])
    out = tmp_path_factory.mktemp("export") / "sglang"
    export_sglang(
        draft,
        out,
        aux=AuxLayers.default(text.num_hidden_layers),
        target_config=json.loads((demo_model_dir / "config.json").read_text()),
        serving_context=8192,
        dtype="float32",
    )
    return out


@pytest.fixture(scope="module")
def draft(export_dir, model) -> Eagle3Draft:
    return load_sglang_export(export_dir, model.get_input_embeddings().weight, compute_dtype="float32")


@pytest.fixture(scope="module")
def aux(export_dir, model) -> AuxLayers:
    return export_aux_layers(export_dir, model.config.num_hidden_layers)


@pytest.fixture(scope="module")
def greedy_outputs(model, heldout, stops) -> list[list[int]]:
    return [sd.greedy(model, p.input_ids, MAX_NEW, stops).tokens for p in heldout]


def test_greedy_equals_generate(model, heldout, stops, greedy_outputs):
    for prompt, ours in zip(heldout, greedy_outputs, strict=True):
        ids = torch.tensor([prompt.input_ids])
        with torch.no_grad():
            out = model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=MAX_NEW,
                eos_token_id=stops,
                pad_token_id=stops[0],
            )
        assert ours == out[0, ids.shape[1] :].tolist()


def test_aux_layers_come_from_the_export_in_sglang_numbering(aux, export_dir):
    config = json.loads((export_dir / "config.json").read_text())
    assert list(aux.output_of) == config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 14, 26]


@pytest.mark.parametrize("k", [1, 3])
def test_speculative_is_lossless_and_counts_add_up(model, draft, aux, heldout, stops, greedy_outputs, k):
    runs = [sd.speculative(model, draft, aux, p.input_ids, k, MAX_NEW, stops) for p in heldout]
    for run, expected in zip(runs, greedy_outputs, strict=True):
        assert run.tokens == expected
        assert all(0 <= r <= k for r in run.reach)
    stats = _acceptance(runs, k, "per_position")  # raises unless AL == 1 + sum(p_i)
    assert 1 <= stats["acceptance_length"] <= k + 1
    low, high = stats["acceptance_length_range"]
    assert low <= stats["acceptance_length"] <= high
    assert stats["acceptance_length"] == pytest.approx(1 + sum(stats["per_position"]))
    assert stats["per_position"] == sorted(stats["per_position"], reverse=True)
    # The repeating prompt must have had accepted rounds (all k of them for k=1), or
    # this test proves little.
    assert max(runs[0].reach) == 1


def _training_logits(draft: Eagle3Draft, aux_states: torch.Tensor, ids: torch.Tensor, steps: int):
    """Per TTT step, the draft's logits at every position, exactly as training computes them."""
    t = aux_states.shape[1]
    positions = torch.arange(t)[None]
    hidden, cache, out = draft.fc(aux_states), ([], []), []
    for j in range(steps):
        embeds = draft.embed_tokens(shift(ids, j + 1))
        hidden = draft.step(embeds, hidden, positions + j, cache)
        out.append(draft.logits(hidden)[0])
    return out


def _target_states(model, aux: AuxLayers, ids: list[int]) -> torch.Tensor:
    with sd.AuxHooks(model, aux) as hooks, torch.inference_mode():
        model(input_ids=torch.tensor([ids]))
        return hooks.take()


def test_draft_inference_path_matches_training_math(model, draft, aux, heldout, greedy_outputs):
    ids = heldout[1].input_ids + greedy_outputs[1]
    states = _target_states(model, aux, ids)
    t = len(ids) - 3  # room for the tokens steps 1 and 2 read at the last position
    with torch.inference_mode():
        # Causal: logits at a position do not depend on later ones, so the whole sequence
        # gives training's logits at every position compared below.
        train_logits = _training_logits(draft, states, torch.tensor([ids]), steps=3)
        state = sd.DraftState(draft, len(ids) + 3)
        start = 0
        for end in (t - 9, t - 8, t - 5, t - 3, t):  # chunks of several sizes, as rounds accept
            hidden = state.extend(states[0, start:end], torch.tensor(ids[start + 1 : end + 1]))
            last = end - 1
            torch.testing.assert_close(draft.logits(hidden)[0, 0], train_logits[0][last])
            for step in (1, 2):
                hidden = state.speculate(hidden, torch.tensor(ids[last + step + 1]), step)
                torch.testing.assert_close(draft.logits(hidden)[0, 0], train_logits[step][last])
            start = end


def _token_sensitive_draft(model, seed: int) -> Eagle3Draft:
    """A random draft whose chained proposals can differ from step to step.

    Plain random weights barely react to the token a step is fed (the residual stream
    carries the hidden state along), so the chain repeats one token. With q_proj tied to
    k_proj each query scores its own key highest (same rotary position), so a step
    attends mostly to the value built from the token it was fed.
    """
    torch.manual_seed(seed)
    c = DraftConfig.from_target(model.config.get_text_config(), 512, 8192)
    draft = Eagle3Draft(c, model.get_input_embeddings().weight.detach()).eval()
    mapping = vocab.build({t: 1 for t in range(0, c.vocab_size, 96)}, 512, c.vocab_size)
    draft.set_vocab(mapping["d2t"], mapping["t2d"])
    attn = draft.midlayer.self_attn
    with torch.no_grad():
        keys = attn.k_proj.weight.view(c.num_key_value_heads, c.head_dim, -1)
        groups = c.num_attention_heads // c.num_key_value_heads
        attn.q_proj.weight.copy_(keys.repeat_interleave(groups, 0).reshape(attn.q_proj.weight.shape))
        attn.o_proj.weight.mul_(8)
    return draft


def test_propose_chains_its_own_tokens_as_training_would(model, aux, heldout, greedy_outputs):
    """Step j of a round is fed proposal j, as training feeds the token j+1 ahead."""
    wide = _token_sensitive_draft(model, seed=5)
    ids = heldout[1].input_ids + greedy_outputs[1]
    states = _target_states(model, aux, ids)
    end = len(heldout[1].input_ids)
    seen: list[torch.Tensor] = []
    hook = wide.lm_head.register_forward_hook(lambda _m, _i, out: seen.append(out.reshape(-1)))
    with torch.inference_mode():
        proposals = sd.DraftState(wide, len(ids)).propose(states[0, :end], torch.tensor(ids[1 : end + 1]), 3)
        hook.remove()
        chained = ids[: end + 1] + proposals[:2].tolist()
        train = _training_logits(wide, states[:, : len(chained)], torch.tensor([chained]), steps=3)
    for step, logits in enumerate(train):
        torch.testing.assert_close(seen[step], logits[end - 1])
    assert proposals[0] != proposals[1]  # else feeding the wrong proposal could go unseen


def test_decode_loop_feeds_the_draft_what_training_did(model, draft, aux, heldout, stops):
    """Each round's draft logits equal training's at the last accepted position of the
    final sequence: step 0 always, step 1 when the first proposal was right (only then
    does training's shifted token equal what the draft was fed)."""
    k = 3
    rounds: list[int] = []
    logits_seen: list[torch.Tensor] = []

    def recording(proposals: list[int], best: list[int]) -> int:
        rounds.append(sd.longest_agreeing_prefix(proposals, best))
        return rounds[-1]

    hook = draft.lm_head.register_forward_hook(lambda _m, _i, out: logits_seen.append(out.reshape(-1)))
    try:
        prompt = heldout[0].input_ids
        run = sd.speculative(model, draft, aux, prompt, k, MAX_NEW, stops, accept=recording)
    finally:
        hook.remove()
    ids = prompt + run.tokens
    with torch.inference_mode():
        train_logits = _training_logits(draft, _target_states(model, aux, ids), torch.tensor([ids]), steps=2)
    last = len(prompt) - 1
    for r, accepted in enumerate(rounds):
        seen = logits_seen[r * k : (r + 1) * k]
        torch.testing.assert_close(seen[0], train_logits[0][last], atol=1e-4, rtol=1e-4)
        if accepted:
            torch.testing.assert_close(seen[1], train_logits[1][last], atol=1e-4, rtol=1e-4)
        last += accepted + 1
    assert len(logits_seen) == k * len(rounds) and any(rounds)


def test_broken_verification_is_caught_with_prompt_and_position(
    model, draft, aux, heldout, stops, greedy_outputs
):
    def accept_everything(proposals: list[int], _best: list[int]) -> int:
        return len(proposals)

    settings = Settings([Speculation.chain(3)], max_new_tokens=MAX_NEW, stops=stops, warmup_prompts=0)
    broken = sd.speculative(model, draft, aux, heldout[1].input_ids, 3, MAX_NEW, stops, accept_everything)
    at = next(i for i, (a, b) in enumerate(zip(greedy_outputs[1], broken.tokens, strict=False)) if a != b)
    with pytest.raises(LosslessError) as caught:
        benchmark_sets(model, draft, aux, {"tiny": heldout[1:]}, settings, accept=accept_everything)
    message = str(caught.value)
    assert f"prompt set 'tiny' prompt {heldout[1].id}, k=3" in message
    assert f"position {at}: greedy {greedy_outputs[1][at]}, speculative {broken.tokens[at]}" in message
    assert re.search(r"top-2 logit margin there: [0-9.e+-]+", message)


def test_a_resumed_evaluation_decodes_only_the_prompts_it_has_not_recorded(
    model, draft, aux, heldout, stops, tmp_path
):
    settings = Settings(
        [Speculation.chain(2), Speculation.of(TREE)], max_new_tokens=MAX_NEW, stops=stops, warmup_prompts=0
    )
    sets, path = {"tiny": heldout}, tmp_path / "journal.jsonl"

    def run() -> tuple[dict, list[dict], Journal]:
        journal = Journal(path)
        try:
            return *benchmark_sets(model, draft, aux, sets, settings, journal=journal), journal
        finally:
            journal.close()

    full, full_rows, journal = run()
    assert sorted(journal.records) == [f"tiny/{p.id}" for p in heldout]
    # A job stopped after its first prompt: the journal holds that prompt alone, its baseline
    # time marked so that the resumed job's use of it shows.
    first = json.loads(path.read_text().splitlines()[0])
    first["runs"]["baseline"]["seconds"] = 1000.0
    path.write_text(json.dumps(first) + "\n")
    resumed, rows, journal = run()
    assert rows[0]["setting"] == "baseline" and rows[0]["seconds"] == 1000.0
    assert sorted(journal.records) == [f"tiny/{p.id}" for p in heldout]  # the rest decoded, recorded

    def untimed(table: list[dict]) -> list[dict]:
        return [{k: v for k, v in row.items() if k != "seconds"} for row in table]

    assert untimed(rows) == untimed(full_rows)  # the same tokens, verify steps and AL
    for section, key in (("by_k", "2"), ("by_tree", "2-2-4")):
        got, want = resumed["tiny"][section][key], full["tiny"][section][key]
        assert got["acceptance_length"] == want["acceptance_length"] and got["tokens"] == want["tokens"]


def test_broken_tree_verification_is_caught_with_the_tree_named(
    model, draft, aux, heldout, stops, greedy_outputs
):
    def deepest_path(tree: td.DraftTree, _best: list[int]) -> list[int]:
        """The path to the deepest node, whatever the target says."""
        depths = tree.depths()
        node, path = max(range(len(depths)), key=depths.__getitem__), []
        while node >= 0:
            path.insert(0, node + 1)
            node = tree.parents[node]
        return [0, *path]

    settings = Settings([Speculation.of(TREE)], max_new_tokens=MAX_NEW, stops=stops, warmup_prompts=0)
    ids = heldout[1].input_ids
    broken = td.tree_speculative(model, draft, aux, ids, *TREE.values(), MAX_NEW, stops, deepest_path)
    at = next(i for i, (a, b) in enumerate(zip(greedy_outputs[1], broken.tokens, strict=False)) if a != b)
    with pytest.raises(LosslessError) as caught:
        benchmark_sets(model, draft, aux, {"tiny": heldout[1:]}, settings, accept_tree=deepest_path)
    message = str(caught.value)
    assert f"prompt set 'tiny' prompt {heldout[1].id}, tree 2/2/4: speculative output differs" in message
    assert f"position {at}: greedy {greedy_outputs[1][at]}, speculative {broken.tokens[at]}" in message


@pytest.mark.parametrize(
    ("tree_speedups", "setting", "flags"),
    [
        # k=3 wins set a, the tree set b; the tree on the mean: (1.5 + 2.0) / 2 > (1.9 + 1.2) / 2.
        ((1.5, 2.0), "tree 3/2/6", ["3", "2", "6"]),
        ((1.5, 1.0), "k=3", ["3", "1", "4"]),  # a chain of k is S=k, T=1, N=k+1
    ],
)
def test_recommended_is_the_best_mean_speedup_with_its_sglang_flags(tree_speedups, setting, flags):
    chains = [Speculation.chain(1), Speculation.chain(3)]
    settings = Settings([*chains, Speculation(3, 2, 6)], max_new_tokens=8, stops=[], warmup_prompts=0)
    speedups = {"a": {"k=1": 1.2, "k=3": 1.9}, "b": {"k=1": 1.1, "k=3": 1.2}}
    speedups["a"]["tree 3/2/6"], speedups["b"]["tree 3/2/6"] = tree_speedups
    prompt_sets = {name: {"by_k": {}, "by_tree": {}} for name in speedups}
    for measured in settings.measured:
        section, key = section_key(measured)
        for name, entry in prompt_sets.items():
            entry[section][key] = {"speedup": speedups[name][measured.label]}
    launches = {measured: sglang_launch(measured, 8192) for measured in settings.measured}
    placeholders = {"TARGET_MODEL": "/models/target", "DRAFT_DIR": "artifacts/export/0123/sglang"}
    recommended = recommend(prompt_sets, launches, placeholders)
    means = {label: (speedups["a"][label] + speedups["b"][label]) / 2 for label in speedups["a"]}
    assert recommended["setting"] == setting == max(means, key=means.get)
    assert recommended["mean_speedup"] == pytest.approx(means[setting])
    names = ["--speculative-num-steps", "--speculative-eagle-topk", "--speculative-num-draft-tokens"]
    expected = ["--speculative-algorithm", "EAGLE3"] + [
        a for pair in zip(names, flags, strict=True) for a in pair
    ]
    assert recommended["flags"] == expected
    assert [recommended[key] for key in ("num_steps", "topk", "num_draft_tokens")] == [int(f) for f in flags]
    command = recommended["command"]
    assert command.startswith('python3 -m sglang.launch_server --model-path "$TARGET_MODEL" ')
    assert " --tp-size 1 --context-length 8192 --speculative-algorithm " in command
    assert '--speculative-algorithm EAGLE3 --speculative-draft-model-path "$DRAFT_DIR" ' in command
    assert command.endswith(" ".join(expected[2:]))
    assert recommended["placeholders"] == placeholders
    assert recommended["checked_by_sglang"] is (importlib.util.find_spec("sglang") is not None)


# --- prompt sets and overlap ---------------------------------------------------------
def _eval_prompt(prompt_id: str, text: str) -> EvalPrompt:
    return EvalPrompt(prompt_id, 1, [{"role": "user", "content": text}], [])


def test_overlap_refuses_a_case_and_whitespace_variant(tmp_path):
    train, responses = write_training(
        tmp_path, {"chat-000000": "How do tides work?", "chat-000001": "Why is the sky blue?"}
    )
    training = training_prompts(train, [responses])
    check_overlap({"heldout": [_eval_prompt("heldout-000000", "How do glaciers form?")]}, training)
    planted = _eval_prompt("heldout-000001", "  WHY is the\tsky   ｂｌｕｅ? ")  # fullwidth: NFKC
    with pytest.raises(OverlapError, match=r"prompt set 'heldout' row heldout-000001 .* chat-000001"):
        check_overlap(
            {"heldout": [_eval_prompt("heldout-000000", "How do glaciers form?"), planted]}, training
        )


def test_overlap_needs_every_training_prompt(tmp_path):
    train, responses = write_training(tmp_path, {"chat-000000": "How do tides work?"})
    atomic.write_jsonl(train, [{"id": "chat-000000"}, {"id": "code-000004"}])
    with pytest.raises(OverlapError, match="code-000004"):
        training_prompts(train, [responses])


def test_demo_heldout_set_is_disjoint_from_every_demo_dataset_row(demo_model_dir):
    """Every row of the demo datasets, not just the merged ones: a later cap change must
    not turn the shipped held-out set into training data."""
    from draftsmith.formats.datasets.load import load_prompts

    formats = {"chat": "messages", "code": "prompt", "math": "sharegpt"}
    training = {}
    for name, fmt in formats.items():
        entry = {
            "path": str(REPO / f"resources/datasets/{name}.jsonl"),
            "format": fmt,
            "prompt_field": "prompt",
        }
        prompts: list[Prompt] = load_prompts(name, entry).prompts
        training.update({prompt_hash(p.messages): p.id for p in prompts})
    entry = {
        "path": str(REPO / "resources/eval/heldout.jsonl"),
        "format": "prompt",
        "prompt_field": "prompt",
        "max_prompts": None,
    }
    heldout = load_prompt_set("heldout", entry, target.load_tokenizer(demo_model_dir), None)
    assert len(heldout) == 30
    check_overlap({"heldout": heldout}, training)


# --- the stage ------------------------------------------------------------------------
def stage_inputs(
    tmp: Path,
    demo_model_dir: Path,
    model_info: dict,
    export_dir: Path,
    questions: list[str],
    prompts: list[str],
    **sections,
) -> tuple[dict, dict]:
    """A validated config whose held-out set `tiny` holds `prompts` (`sections` add or
    extend config sections), and evaluation inputs for a draft trained on `questions`."""
    evaluate = {
        "max_new_tokens": 8,
        "warmup_prompts": 1,
        "prompt_sets": {"tiny": {"path": str(write_rows(tmp / "eval.jsonl", prompts))}},
        **sections.pop("evaluate", {}),
    }
    config = cfg.validate(
        {
            "experiment": "test",
            "artifacts_dir": str(tmp / "artifacts"),
            "logs_dir": str(tmp / "logs"),
            "model": {"source": {"kind": "hf_dir", "path": str(demo_model_dir)}, "probe_generation": False},
            "datasets": {
                "chat": {"path": str(write_rows(tmp / "data.jsonl", questions)), "format": "prompt"}
            },
            "evaluate": evaluate,
            **sections,
        }
    )
    atomic.write_json(tmp / "model.json", model_info)
    train, responses = write_training(tmp, {f"chat-{i:06d}": q for i, q in enumerate(questions)})
    inputs = {
        "model": str(tmp / "model.json"),
        "export_config": str(export_dir / "config.json"),
        "merged": str(train),
        "responses": [str(responses)],
    }
    return config, inputs


def _stage_setup(
    tmp: Path,
    demo_model_dir: Path,
    model_info: dict,
    export_dir: Path,
    questions: list[str],
    prompts: list[str] = PROMPTS,
    **evaluate,
):
    config, inputs = stage_inputs(
        tmp,
        demo_model_dir,
        model_info,
        export_dir,
        questions,
        prompts,
        evaluate={"k": [1, 2], "trees": [TREE], **evaluate},
    )
    out = tmp / "eval"
    names = {"json": "benchmark.json", "md": "benchmark.md", "per_prompt": "per_prompt.jsonl"}
    outputs = {key: str(out / name) for key, name in {**names, "manifest": "manifest.json"}.items()}
    return config, inputs, outputs


def run_evaluate(config: dict, inputs: dict, outputs: dict) -> dict:
    """Rule `evaluate`'s job on `config` as the workflow hands it its settings and artifacts."""
    resolved = configure(config)
    return evaluate(resolved.evaluate, resolved.plan.evaluate, inputs, outputs, export=resolved.plan.export)


def test_stage_writes_the_benchmark_schema(tmp_path, demo_model_dir, model_info, export_dir):
    config, inputs, outputs = _stage_setup(
        tmp_path, demo_model_dir, model_info, export_dir, ["How do tides work?"]
    )
    run_evaluate(config, inputs, outputs)
    bench = json.loads(Path(outputs["json"]).read_text())
    assert set(bench) == {
        "key",
        "device",
        "dtype",
        "max_new_tokens",
        "k",
        "trees",
        "wall_s",
        "lossless",
        "prompt_sets",
        "recommended",
        "long_context",
        "by_set",
    }
    assert bench["key"] == plan_for(config).evaluate.key and bench["lossless"] is True
    assert bench["k"] == [1, 2] and bench["trees"] == [TREE] and bench["device"].startswith("cpu")
    tiny = bench["prompt_sets"]["tiny"]
    assert tiny["prompts"] == len(PROMPTS)
    assert 0.0 <= tiny["draft_vocab_coverage"] <= 1.0
    assert set(tiny["baseline"]) == {"tokens", "seconds", "tokens_per_s"}
    assert set(tiny["by_k"]) == {"1", "2"}
    for k, result in tiny["by_k"].items():
        assert set(result) == {
            "acceptance_length",
            "acceptance_length_range",
            "acceptance_rate",
            "per_position",
            "verify_steps",
            "tokens",
            "seconds",
            "tokens_per_s",
            "speedup",
        }
        assert len(result["per_position"]) == int(k)
        low, high = result["acceptance_length_range"]
        assert 1 <= low <= result["acceptance_length"] <= high <= int(k) + 1
        assert result["tokens"] == tiny["baseline"]["tokens"]  # lossless: the same outputs
        assert result["speedup"] == pytest.approx(result["tokens_per_s"] / tiny["baseline"]["tokens_per_s"])
    assert set(tiny["by_tree"]) == {"2-2-4"}
    tree = tiny["by_tree"]["2-2-4"]
    assert set(tree) == {
        "num_steps",
        "topk",
        "num_draft_tokens",
        "acceptance_length",
        "acceptance_length_range",
        "per_depth",
        "verify_steps",
        "tokens",
        "seconds",
        "tokens_per_s",
        "speedup",
    }
    assert {key: tree[key] for key in TREE} == TREE
    assert (
        len(tree["per_depth"]) == TREE["num_steps"] and tree["per_depth"] == sorted(tree["per_depth"])[::-1]
    )
    assert tree["acceptance_length"] == pytest.approx(1 + sum(tree["per_depth"]))
    assert 1 <= tree["acceptance_length"] <= TREE["num_steps"] + 1
    # Every token after each prompt's first (the prefill's) came from a verify step.
    assert tree["acceptance_length"] * tree["verify_steps"] == pytest.approx(tree["tokens"] - len(PROMPTS))
    assert tree["tokens"] == tiny["baseline"]["tokens"]
    assert tree["speedup"] == pytest.approx(tree["tokens_per_s"] / tiny["baseline"]["tokens_per_s"])
    speedups = {"k=1": tiny["by_k"]["1"], "k=2": tiny["by_k"]["2"], "tree 2/2/4": tree}
    best = max(speedups, key=lambda label: speedups[label]["speedup"])  # one prompt set: its mean
    recommended = bench["recommended"]
    assert recommended["setting"] == best and recommended["mean_speedup"] == speedups[best]["speedup"]
    steps, topk, tokens = (recommended[key] for key in ("num_steps", "topk", "num_draft_tokens"))
    assert f"--speculative-num-steps {steps} --speculative-eagle-topk {topk} " in recommended["command"]
    assert recommended["placeholders"]["DRAFT_DIR"] == str(
        plan_for(config).export.path("sglang_config").parent
    )
    rows = list(atomic.read_jsonl(outputs["per_prompt"]))
    assert len(rows) == len(PROMPTS) * 4 and {r["k"] for r in rows} == {0, 1, 2, None}
    assert {(r["setting"], r["k"]) for r in rows} == {
        ("baseline", 0),
        ("k=1", 1),
        ("k=2", 2),
        ("tree 2/2/4", None),
    }
    table = Path(outputs["md"]).read_text()
    assert "## tiny (2 prompts)" in table and table.count("x |") == 3
    assert "| 2/2/4 | " in table and f"Best: {best}, " in table
    assert "## Recommended SGLang settings" in table and recommended["command"] in table
    slower = "No setting beat the target alone here" in table
    assert slower is (recommended["mean_speedup"] <= 1)
    assert f"coverage of the target's output: {100 * tiny['draft_vocab_coverage']:.1f}%" in table
    written = json.loads(Path(outputs["manifest"]).read_text())["files"]
    assert set(written) == {"benchmark.json", "benchmark.md", "per_prompt.jsonl"}
    assert not [p for p in Path(outputs["json"]).parent.iterdir() if p.name.startswith(".tmp-")]


# Long enough to land above 64 prompt tokens, chat template included.
LONG_PROMPT = (
    "Here is a note about my garden. The tomatoes grew tall this summer, the beans climbed "
    "the fence, the lettuce bolted in the heat and the carrots stayed small because the soil "
    "was too hard. Next year I want to add compost, water in the morning and plant earlier. "
    "Summarise the note in one sentence."
)


@pytest.mark.slow  # a second stage run; tests/evaluate/test_length.py checks the buckets
def test_stage_reports_acceptance_by_prompt_length(tmp_path, demo_model_dir, model_info, export_dir):
    """by_length comes from the decoding already done: per bucket, verify-step weighted,
    empty buckets left out; the long-context flag compares the recommended setting."""
    config, inputs, outputs = _stage_setup(
        tmp_path,
        demo_model_dir,
        model_info,
        export_dir,
        ["How do tides work?"],
        prompts=[*PROMPTS, LONG_PROMPT],
        length_buckets=[16, 64],
    )
    bench = run_evaluate(config, inputs, outputs)
    rows = list(atomic.read_jsonl(outputs["per_prompt"]))
    lengths = sorted(r["prompt_tokens"] for r in rows if r["setting"] == "baseline")
    assert 16 <= lengths[0] <= lengths[1] < 64 <= lengths[2]  # "<16" holds no prompt
    tiny = bench["prompt_sets"]["tiny"]
    buckets = tiny["by_length"]
    assert [(b["bucket"], b["min_tokens"], b["max_tokens"], b["prompts"]) for b in buckets] == [
        ("16-64", 16, 63, 2),
        (">=64", 64, None, 1),
    ]
    labels = ["k=1", "k=2", "tree 2/2/4"]
    for label, result in zip(
        labels, [tiny["by_k"]["1"], tiny["by_k"]["2"], tiny["by_tree"]["2-2-4"]], strict=True
    ):
        steps = [b["verify_steps"][label] for b in buckets]
        assert sum(steps) == result["verify_steps"]
        weighted = sum((b["settings"][label] or 0) * b["verify_steps"][label] for b in buckets)
        assert weighted / sum(steps) == pytest.approx(result["acceptance_length"])
    flag = bench["long_context"]
    setting = bench["recommended"]["setting"]
    short, long = (b["settings"][setting] for b in buckets)
    assert flag["flagged"] is (long < 0.8 * short) and flag["threshold"] == 0.8
    assert flag["draft"] == {
        "training_max_length": config["tokenize"]["max_length"],
        "max_position_embeddings": 8192,
        "rope_scaling": None,
    }
    table = Path(outputs["md"]).read_text()
    assert "Acceptance length by prompt length" in table and "| >=64 | 1 | " in table
    assert ("**Long-context warning:**" in table) is flag["flagged"]


def test_stage_refuses_an_overlapping_set_before_writing(tmp_path, demo_model_dir, model_info, export_dir):
    config, inputs, outputs = _stage_setup(
        tmp_path, demo_model_dir, model_info, export_dir, ["repeat the word HELLO ten times."]
    )
    with pytest.raises(OverlapError, match="chat-000000"):
        run_evaluate(config, inputs, outputs)
    assert not Path(outputs["json"]).parent.exists()


def test_vocab_coverage_counts_output_tokens_after_the_first():
    in_draft = torch.tensor([True, False, True, False, False, True])  # t2d over 6 target ids
    draft = SimpleNamespace(t2d=in_draft)
    # The first token (from the prefill, never proposed) is left out even when it is outside.
    runs = [sd.Decoded([1, 0, 3, 2]), sd.Decoded([4, 5])]
    assert vocab_coverage(draft, runs) == pytest.approx(3 / 4)
    with pytest.raises(EvaluationError, match="max_new_tokens"):
        vocab_coverage(draft, [sd.Decoded([0])])


def test_acceptance_gives_the_range_of_one_prompts_acceptance_length():
    # 4 tokens after the prefill's in 2 steps (AL 2), 3 in 3 steps (AL 1), and a prompt that
    # ended at its first token (no verify step: in no prompt's figure).
    runs = [
        sd.Decoded([7, 1, 2, 3, 4], reach=[1, 1]),
        sd.Decoded([7, 5, 6, 8], reach=[0, 0, 0]),
        sd.Decoded([9]),
    ]
    stats = _acceptance(runs, 1, "per_position")
    assert stats["acceptance_length"] == pytest.approx(7 / 5)
    assert stats["acceptance_length_range"] == [1.0, 2.0]
