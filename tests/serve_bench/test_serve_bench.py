"""The SGLang serving benchmark: commands, refusals, payload parsing, arithmetic, server lifetimes.

No GPU and no SGLang server here: payloads are built in the shape sglang 0.5.23 documents
(see draftsmith.serve_bench.metrics' docstring for the source file), and server lifetimes are
checked against a small stand-in started through the same launch code.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
from conftest import sglang_block, sglang_server_args, write_rows, write_training

from draftsmith.errors import ConfigError, ServerError
from draftsmith.formats.prompt_sets import OverlapError
from draftsmith.runtime.process import free_port
from draftsmith.runtime.sglang import speculative_flags
from draftsmith.serve_bench import metrics
from draftsmith.serve_bench.command import (
    ServeBenchError,
    check_draft,
    check_environment,
    check_launch,
    draft_command,
    launch_command,
    serving_context,
    serving_server,
)
from draftsmith.serve_bench.settings import ServeBenchSettings
from draftsmith.serve_bench.stage import (
    BenchPrompt,
    build_commands,
    run_benchmark,
    run_server,
    serve_bench,
)
from draftsmith.speculation import Speculation
from draftsmith.store import manifest
from draftsmith.workflow import configure

MODEL = "/models/target"
DRAFT = Path("/artifacts/export/0123456789abcdef/sglang")
BASE = ["python3", "-m", "sglang.launch_server", "--model-path", MODEL,
        "--host", "127.0.0.1", "--port", "31000", "--tp-size", "1"]  # fmt: skip
# The draft as exported: SGLang would otherwise quantize it as the target's --quantization says.
LOAD_DRAFT = ["--speculative-draft-model-path", str(DRAFT),
              "--speculative-draft-model-quantization", "unquant"]  # fmt: skip


def _config(tmp_path: Path, top: dict | None = None, **bench) -> dict:
    """A validated config: serve_benchmark enabled with `bench` on top, other sections from `top`."""
    prompts = write_rows(tmp_path / "held.jsonl", ["Name three colours.", "Count to five."])
    config = {
        "experiment": "serve-test",
        "artifacts_dir": str(tmp_path / "artifacts"),
        "model": {"source": {"kind": "hf_dir", "path": str(tmp_path / "target")}},
        "datasets": {"train": {"path": str(prompts), "format": "prompt"}},
        "evaluate": {"prompt_sets": {"held": {"path": str(prompts)}}},
        "serve_benchmark": {"enabled": True, "prompt_set": "held", **bench},
        "extract": {"num_shards": 2},
    }
    config |= top or {}
    configure(config)  # as the Snakefile does: schema, then the stage's own refusals
    return config


def _bench(tmp_path: Path, top: dict | None = None, **bench) -> ServeBenchSettings:
    """The stage's settings of `_config`'s config, as `workflow.configure` resolves them."""
    return configure(_config(tmp_path, top, **bench)).serve_bench


def _run_stage(config: dict, inputs: dict, outputs: dict) -> dict:
    """The job as the rule runs it: the stage's settings and planned artifact."""
    resolved = configure(config)
    return serve_bench(resolved.serve_bench, resolved.plan.serve_bench, inputs, outputs)


# --- commands ---------------------------------------------------------------------------
def test_baseline_and_chain_commands(tmp_path):
    commands = build_commands(MODEL, DRAFT, _bench(tmp_path, k=[1, 3]), 31000)
    assert commands == {
        "baseline": BASE,
        "k=1": BASE + [
            "--speculative-algorithm", "EAGLE3", *LOAD_DRAFT,
            "--speculative-num-steps", "1", "--speculative-eagle-topk", "1",
            "--speculative-num-draft-tokens", "2",
        ],
        "k=3": BASE + [
            "--speculative-algorithm", "EAGLE3", *LOAD_DRAFT,
            "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
            "--speculative-num-draft-tokens", "4",
        ],
    }  # fmt: skip


def test_server_settings_then_extra_args(tmp_path):
    extra = ["--disable-custom-all-reduce", "--trust-remote-code"]
    sglang = {"python": "/opt/sglang/bin/python", "tp_size": 8, "mem_fraction_static": 0.85,
              "context_length": 16384, "extra_args": extra}  # fmt: skip
    top = {"export": {"serving_context": 16384}}
    bench = _bench(tmp_path, top, k=[7], num_draft_tokens=8, sglang=sglang)
    (chain,) = bench.chains
    assert draft_command(MODEL, bench.server, 30500, DRAFT, chain, bench.speculative_algorithm) == [
        "/opt/sglang/bin/python", "-m", "sglang.launch_server", "--model-path", MODEL,
        "--host", "127.0.0.1", "--port", "30500", "--tp-size", "8",
        "--mem-fraction-static", "0.85", "--context-length", "16384",
        "--speculative-algorithm", "EAGLE3", *LOAD_DRAFT,
        "--speculative-num-steps", "7", "--speculative-eagle-topk", "1",
        "--speculative-num-draft-tokens", "8",
        "--disable-custom-all-reduce", "--trust-remote-code",
    ]  # fmt: skip


def test_sglang_parses_the_commands(tmp_path):
    """SGLang's own parser reads every command: the baseline, the chains, the search's tree."""
    server_args = sglang_server_args()
    sglang = {"tp_size": 2, "context_length": 4096, "extra_args": ["--quantization", "fp8"]}
    bench = _bench(tmp_path, k=[1, 4], sglang=sglang)
    commands = build_commands(MODEL, DRAFT, bench, 31000, [Speculation(3, 2, 6)])
    assert list(commands) == ["baseline", "k=1", "k=4", "tree 3/2/6"]
    settings = {"k=1": (1, 1, 2), "k=4": (4, 1, 5), "tree 3/2/6": (3, 2, 6), "baseline": (None, None, None)}
    for name, cmd in commands.items():
        args = server_args.prepare_server_args(cmd[3:])
        assert (args.model_path, args.host, args.port, args.tp_size) == (MODEL, "127.0.0.1", 31000, 2)
        assert (args.context_length, args.quantization) == (4096, "fp8")
        draft = name != "baseline"
        assert args.speculative_algorithm == ("EAGLE3" if draft else None)
        assert args.speculative_draft_model_path == (str(DRAFT) if draft else None)
        read = (args.speculative_num_steps, args.speculative_eagle_topk, args.speculative_num_draft_tokens)
        assert read == settings[name]
        # The target is fp8; the draft runs as exported, not inheriting it.
        assert args.speculative_draft_model_quantization == ("unquant" if draft else None)
        assert args.speculative_draft_window_size is None and not args.speculative_use_rejection_sampling


TREE_FLAGS = speculative_flags(Speculation(3, 2, 6), "EAGLE3", DRAFT)


def test_check_launch_without_sglang_knows_the_flags(monkeypatch):
    for name in ("sglang", "sglang.srt", "sglang.srt.server_args"):
        monkeypatch.setitem(sys.modules, name, None)  # not importable, installed (or imported) or not
    assert check_launch(BASE + TREE_FLAGS, TREE_FLAGS) is False
    with pytest.raises(ServeBenchError, match=r"\['--speculative-tree-width'\]: not SGLang launch flags"):
        check_launch(BASE + ["--speculative-tree-width", "2"], ["--speculative-tree-width", "2"])


def _sglang_stand_in(monkeypatch, topk_type) -> None:
    """`sglang.srt.server_args.ServerArgs.add_cli_args` with SGLang's spellings of the flags built here."""

    class ServerArgs:
        @staticmethod
        def add_cli_args(parser) -> None:
            parser.add_argument("--model-path", required=True)
            for flag in ("--host", "--speculative-algorithm", "--speculative-draft-model-path",
                         "--speculative-draft-model-quantization"):  # fmt: skip
                parser.add_argument(flag)
            for flag in ("--port", "--tp-size", "--speculative-num-steps", "--speculative-num-draft-tokens"):
                parser.add_argument(flag, type=int)
            parser.add_argument("--speculative-eagle-topk", type=topk_type)

    for name in ("sglang", "sglang.srt"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    module = types.ModuleType("sglang.srt.server_args")
    module.ServerArgs = ServerArgs
    monkeypatch.setitem(sys.modules, module.__name__, module)


def test_check_launch_has_sglangs_parser_read_the_command(monkeypatch):
    _sglang_stand_in(monkeypatch, int)
    assert check_launch(BASE + TREE_FLAGS, TREE_FLAGS) is True
    with pytest.raises(ServeBenchError, match="SGLang's argument parser refuses"):
        check_launch(BASE + TREE_FLAGS + ["--no-such-flag"], TREE_FLAGS)
    _sglang_stand_in(monkeypatch, lambda _value: 1)  # a parser that reads another topk than given
    with pytest.raises(ServeBenchError, match="SGLang reads --speculative-eagle-topk 2 as 1"):
        check_launch(BASE + TREE_FLAGS, TREE_FLAGS)


def test_sglang_reads_a_tree_launch():
    """SGLang's own parser checks a tree's flags, as the evaluator's recommended launch."""
    sglang_server_args()
    assert check_launch(BASE + TREE_FLAGS, TREE_FLAGS) is True


# --- refusals ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("bench", "message"),
    [
        ({"speculative_algorithm": "EAGLE"}, r"serve_benchmark.speculative_algorithm: EAGLE with an EAGLE-3 "
                                             r"draft \(LlamaForCausalLMEagle3\).*\(H\) instead of the three"),
        ({"k": [3], "num_draft_tokens": 5}, r"serve_benchmark.num_draft_tokens for k=3: topk 1 is a "
                                            r"chain, which SGLang runs with num_draft_tokens = "
                                            r"num_steps \+ 1 \(4\), not 5 \(leave it null\)"),
        ({"k": [3, 4], "num_draft_tokens": 4}, r"num_draft_tokens for k=4: .* \(5\), not 4"),
        ({"eagle_topk": 2}, r"serve_benchmark.eagle_topk: 2: the benchmark measures chains \(topk 1\)"),
        ({"prompt_set": "mtbench"}, r"serve_benchmark.prompt_set: 'mtbench' is not a set of "
                                    r"evaluate.prompt_sets \(known: \['held'\]\)"),
        ({"sglang": {"context_length": 16384}},
         r"serve_benchmark.sglang.context_length \(16384\) exceeds the context the draft is exported "
         r"for \(8192, export.serving_context"),
        ({"sglang": {"extra_args": ["--speculative-token-map", "m.pt"]}},
         r"serve_benchmark.sglang.extra_args: --speculative-token-map is refused"),
    ],
)  # fmt: skip
def test_config_validation_refuses(tmp_path, bench, message):
    with pytest.raises(ConfigError, match=message):
        _config(tmp_path, **bench)


def test_config_validation_names_every_problem_at_once(tmp_path):
    with pytest.raises(ConfigError) as err:
        _config(tmp_path, speculative_algorithm="EAGLE", eagle_topk=2)
    assert "speculative_algorithm" in str(err.value) and "eagle_topk" in str(err.value)


def test_disabled_block_is_not_checked(tmp_path):
    config = _config(tmp_path)
    config["serve_benchmark"] = {"enabled": False, "speculative_algorithm": "EAGLE"}
    assert configure(config).serve_bench is None  # nothing to refuse for a benchmark that does not run


def test_settings_resolve_the_chains_the_prompt_set_and_the_search_settings(tmp_path):
    sglang = {"tp_size": 2, "extra_args": ["--disable-cuda-graph"]}
    bench = _bench(tmp_path, k=[3, 1], sglang=sglang, concurrency=[1, 4])
    assert bench.chains == (Speculation(3, 1, 4), Speculation(1, 1, 2))  # num_draft_tokens null: k + 1
    assert (bench.prompt_set.name, bench.prompt_set.path) == ("held", str(tmp_path / "held.jsonl"))
    assert (bench.experiment, bench.concurrency, bench.gpus) == ("serve-test", (1, 4), 2)
    assert bench.server.extra_args == ("--disable-cuda-graph",) and bench.server.port is None
    assert bench.search_settings == 3  # search.confirm_top, the search being on
    off = _bench(tmp_path, top={"search": {"enabled": False, "confirm_top": 5}})
    assert off.search_settings == 0  # no search, so none of its settings
    assert pickle.loads(pickle.dumps(bench)) == bench  # Snakemake hands params to the job pickled


def test_serving_context_may_follow_the_exported_context(tmp_path):
    _config(tmp_path, top={"export": {"serving_context": 16384}}, sglang={"context_length": 16384})
    _config(tmp_path, sglang={"context_length": 8192})  # train.max_position_embeddings 8192 covers it


def check_extra_args(extra: list[str]) -> None:
    """serve_benchmark.sglang with the schema's defaults and `extra`, as the settings build it."""
    serving_server(sglang_block("serve_benchmark", extra_args=extra))


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--speculative-draft-load-format", "dummy"], "random draft weights"),
        (["--speculative-accept-threshold-single=0.5"], "AL rises"),
        (["--speculative-accept-threshold-acc", "0.5"], "AL rises"),
        (["--speculative-adaptive"], "number of draft steps at run time"),
        (["--speculative-adaptive-config", "a.json"], "number of draft steps at run time"),
        (["--enable-multi-layer-eagle"], "multi-layer"),
        (["--speculative-token"], "vocabulary map"),  # an argparse prefix of --speculative-token-map
        (["--config", "server.yaml"], "set any of these flags unseen"),
        (["--api-key", "s3cret"], "puts a secret in the config"),
        (["--load-format", "dummy"], "--load-format dummy loads random weights"),
        (["--load-format=dummy"], "--load-format dummy loads random weights"),
        (["--speculative-num-steps", "5"], "duplicates --speculative-num-steps.*serve_benchmark.k"),
        (["--speculative-draft-model", "/x"], "duplicates --speculative-draft-model, which"),
        (
            ["--speculative-draft-model-q", "fp8"],
            "duplicates --speculative-draft-model-quantization.*unquant",
        ),
        (["--speculative-draft-window-size", "512"], "attention to recent positions"),
        (["--speculative-dflash-draft-window-size=512"], "attention to recent positions"),
        (["--speculative-draft-sink-size", "4"], "attention to recent positions"),
        (["--speculative-draft-kv-cache-dtype", "fp8_e4m3"], "KV cache a dtype of its own"),
        (["--speculative-use-rejection-sampling"], "replaces greedy verification.*samples the draft's"),
        (["--speculative-use-block"], "replaces greedy verification.*rejection sampling on"),
        (["--speculative-algorithm=EAGLE"], "serve_benchmark.speculative_algorithm"),
        (["--speculative-eagle-topk", "4"], "serve_benchmark.eagle_topk"),
        (["--speculative-num-draft-tokens", "9"], "serve_benchmark.num_draft_tokens"),
        (["--port", "1"], "serve_benchmark.sglang.port"),
        (["--host", "0.0.0.0"], "serves on 127.0.0.1"),
        (["--tp", "4"], "serve_benchmark.sglang.tp_size"),
    ],
)
def test_extra_args_refused(extra, message):
    with pytest.raises(ServeBenchError, match=message):
        check_extra_args(["--disable-cuda-graph", *extra])


def test_harmless_extra_args_pass():
    check_extra_args(
        ["--load-format", "safetensors", "--speculative-attention-mode", "decode", "--cuda-graph-max-bs", "8"]
    )


# Speculative options of SGLang 0.5.21 (requirements/sglang-parser.txt) that neither change what
# the benchmark measures nor repeat a flag the builder sets: kernels and backends, a hub revision
# (the export is a local directory), and other algorithms' settings. SGLang itself refuses
# --speculative-skip-dp-mlp-sync with EAGLE3.
HARMLESS = {
    "--speculative-attention-mode", "--speculative-draft-attention-backend",
    "--speculative-dsa-topk-backend", "--speculative-moe-runner-backend", "--speculative-moe-a2a-backend",
    "--speculative-draft-model-revision", "--speculative-skip-dp-mlp-sync",
    "--speculative-dflash-block-size", "--speculative-domino-candidate-pool-size",
}  # fmt: skip
OTHER_ALGORITHMS = ("--speculative-dspark-", "--speculative-ngram-")


def _refused(flag: str) -> bool:
    try:
        check_extra_args([flag])
    except ServeBenchError:
        return True
    return False


def test_every_speculative_option_of_sglang_is_decided():
    """Each speculative option of the installed SGLang is built, refused or harmless (HARMLESS), so
    an option a newer SGLang adds fails here until someone decides on it."""
    parser = argparse.ArgumentParser()
    sglang_server_args().ServerArgs.add_cli_args(parser)
    speculative = [
        action for action in parser._actions if {"speculative", "eagle"} & set(action.dest.split("_"))
    ]
    flags = {flag for action in speculative for flag in action.option_strings}
    assert "--enable-multi-layer-eagle" in flags
    harmless = {flag for flag in flags if flag in HARMLESS or flag.startswith(OTHER_ALGORITHMS)}
    assert {flag for flag in flags if not _refused(flag)} == harmless


def _draft_dir(tmp_path: Path, **config) -> Path:
    path = tmp_path / "sglang"
    path.mkdir(exist_ok=True)
    draft = {"architectures": ["LlamaForCausalLMEagle3"], "max_position_embeddings": 8192, **config}
    (path / "config.json").write_text(json.dumps(draft))
    return path


def test_check_draft_against_its_config(tmp_path):
    assert check_draft(_draft_dir(tmp_path), 8192)["max_position_embeddings"] == 8192
    with pytest.raises(
        ServeBenchError, match=r"max_position_embeddings 2048 is below the serving context 8192"
    ):
        check_draft(_draft_dir(tmp_path, max_position_embeddings=2048), 8192)
    with pytest.raises(
        ServeBenchError, match=r"names architectures \['LlamaForCausalLMEagle'\], not LlamaFor"
    ):
        check_draft(_draft_dir(tmp_path, architectures=["LlamaForCausalLMEagle"]), 8192)
    with pytest.raises(ServeBenchError, match="cannot read the draft's config"):
        check_draft(tmp_path / "missing", 8192)


def test_serving_context_defaults_to_the_target(tmp_path):
    assert serving_context(_bench(tmp_path).server, {"max_position_embeddings": 131072}) == 131072
    assert serving_context(_bench(tmp_path, sglang={"context_length": 4096}).server, {}) == 4096
    with pytest.raises(ServeBenchError, match="set serve_benchmark.sglang.context_length"):
        serving_context(_bench(tmp_path).server, {})


def test_simulated_acceptance_is_refused():
    check_environment({})
    with pytest.raises(ServeBenchError, match="SGLANG_SIMULATE_ACC_LEN=3.2 is set"):
        check_environment({"SGLANG_SIMULATE_ACC_LEN": "3.2"})


# --- payloads -----------------------------------------------------------------------------
def _answer(rid: str, tokens: int, **spec) -> dict:
    """A /generate answer in sglang 0.5.23's shape (tokenizer_manager.py), spec fields on top."""
    meta = {
        "id": rid, "finish_reason": {"type": "length", "length": tokens}, "prompt_tokens": 12,
        "weight_version": "default", "num_retractions": 0, "reasoning_tokens": 0,
        "completion_tokens": tokens, "cached_tokens": 0, "e2e_latency": 0.25, **spec,
    }  # fmt: skip
    return {"text": "one two three", "output_ids": list(range(tokens)), "meta_info": meta}


def _spec(verify: int, tokens: int, k: int) -> dict:
    correct = tokens - 1 - verify
    return {"spec_verify_ct": verify, "spec_accept_length": tokens / verify,
            "spec_accept_rate": correct / (verify * k), "spec_num_correct_drafts": correct,
            "spec_num_proposed_drafts": verify * k}  # fmt: skip


def test_parse_baseline_answer():
    result = metrics.parse_response(_answer("p-1@c1", 64), rid="p-1@c1", k=None, seconds=0.5)
    assert (result.id, result.tokens, result.verify_steps, result.server_seconds) == ("p-1", 64, 0, 0.25)
    assert result.acceptance_length is None and result.text == "one two three"


def test_parse_draft_answer():
    result = metrics.parse_response(_answer("p@k3", 64, **_spec(20, 64, 3)), rid="p@k3", k=3, seconds=0.5)
    assert (result.tokens, result.verify_steps, result.acceptance_length) == (64, 20, 3.2)


def test_draft_answer_without_verify_count_is_an_error():
    with pytest.raises(
        ServeBenchError, match="64 tokens but no meta_info.spec_verify_ct: the draft server did not"
    ):
        metrics.parse_response(_answer("p", 64), rid="p", k=3, seconds=0.5)


def test_one_token_draft_answer_has_no_verify_pass():
    # SGLang adds the spec fields only when spec_verify_ct > 0; the prefill's token needs none.
    assert metrics.parse_response(_answer("p", 1), rid="p", k=3, seconds=0.1).verify_steps == 0


@pytest.mark.parametrize(
    ("answer", "k", "message"),
    [
        (_answer("p", 64, **_spec(20, 64, 3)), None, "from the baseline server: it speculates"),
        (
            _answer("p", 64, **_spec(10, 64, 3)),
            3,
            "64 tokens in 10 verify steps is impossible with 3 draft steps per verify step",
        ),
        (_answer("p", 64, spec_verify_ct=0), 3, "0 verify steps is impossible"),
        (_answer("p", 4, **_spec(5, 4, 3)), 3, "4 tokens in 5 verify steps"),
        (_answer("q", 64), None, r"meta_info.id is 'q' \(answers crossed\?\)"),
        (
            {"text": "x", "meta_info": {"id": "p", "completion_tokens": "64"}},
            None,
            "completion_tokens is '64'",
        ),
        ({"meta_info": {"id": "p", "completion_tokens": 3}}, None, "no text"),
        ({"error": "boom"}, None, "has no meta_info"),
        ([_answer("p", 3)], None, "has no meta_info"),
    ],
)
def test_bad_answers(answer, k, message):
    with pytest.raises(ServeBenchError, match=message):
        metrics.parse_response(answer, rid="p", k=k, seconds=0.5)


def test_request_is_greedy_and_sends_the_rendered_ids():
    assert metrics.build_request("p@c1", [1, 2, 3], 32) == {
        "rid": "p@c1",
        "input_ids": [1, 2, 3],
        "sampling_params": {"max_new_tokens": 32, "temperature": 0.0},
    }


# --- arithmetic ---------------------------------------------------------------------------
def _result(rid: str, tokens: int, seconds: float, verify: int = 0, text: str = "t") -> metrics.RequestResult:
    return metrics.RequestResult(rid, tokens, verify, seconds, None, text)


def test_single_stream_rates_and_aggregate_acceptance():
    # AL is summed tokens over summed steps: 9/2 and 1/1 give 10/3, not the mean of ratios 2.75.
    run = metrics.PassResult(1, [_result("a", 9, 1.0, 2), _result("b", 1, 0.25, 1)], wall_s=9.0)
    summary = metrics.summarize(run, speculative=True)
    assert (summary["tokens"], summary["seconds"], summary["verify_steps"]) == (10, 1.25, 3)
    assert summary["tokens_per_s"] == 8.0  # summed request times, not the wall time
    assert summary["request_tokens_per_s"] == 6.5  # mean of 9/1 and 1/0.25
    assert summary["acceptance_length"] == round(10 / 3, 4)
    assert [r["acceptance_length"] for r in summary["per_request"]] == [4.5, 1.0]


def test_concurrent_rate_is_total_throughput():
    run = metrics.PassResult(4, [_result(str(i), 50, 2.0) for i in range(4)], wall_s=2.5)
    summary = metrics.summarize(run, speculative=False)
    assert (summary["tokens_per_s"], summary["request_tokens_per_s"]) == (80.0, 25.0)
    assert "acceptance_length" not in summary


def test_settings_pair_each_k_with_the_baseline():
    baseline = {1: metrics.PassResult(1, [_result("a", 100, 2.0, text="x"), _result("b", 100, 2.0)], 4.0)}
    draft = {
        1: metrics.PassResult(1, [_result("a", 100, 1.0, 40, text="y"), _result("b", 100, 0.6, 30)], 1.6)
    }
    (row,) = metrics.settings(baseline, {Speculation.chain(3): draft})
    assert (row["setting"], row["k"], row["concurrency"]) == ("k=3", 3, 1)
    assert (row["num_steps"], row["topk"], row["num_draft_tokens"]) == (3, 1, 4)
    assert (row["baseline"]["tokens_per_s"], row["draft"]["tokens_per_s"]) == (50.0, 125.0)
    assert row["speedup"] == 2.5
    assert row["draft"]["acceptance_length"] == round(200 / 70, 4)
    assert row["draft"]["same_output_as_baseline"] == 1
    report = {"experiment": "e", "key": "k" * 16, "prompt_set": "held", "prompts": 2, "max_new_tokens": 100,
              "settings": [row]}  # fmt: skip
    assert "| k=3 | 1 | 50.00 | 125.00 | 2.50x | 2.86 | 1/2 |" in metrics.markdown(report)
    (tree,) = metrics.settings(baseline, {Speculation(3, 2, 6): draft})
    assert (tree["setting"], tree["k"], tree["topk"]) == ("tree 3/2/6", None, 2)


def test_speedup():
    assert metrics.speedup({"tokens_per_s": 90.0}, {"tokens_per_s": 82.3}) == round(82.3 / 90.0, 4)
    assert metrics.speedup({"tokens_per_s": None}, {"tokens_per_s": 82.3}) is None


# --- server lifetimes -------------------------------------------------------------------
# Limits: SGLang needs a GPU, so a stand-in takes the place of `python -m
# sglang.launch_server` (given as serve_benchmark.sglang.python). It forks a child (as
# SGLang forks its scheduler and detokenizer), records both pids, and answers /health,
# /flush_cache and /generate in sglang 0.5.23's payload shape: every request generates
# max_new_tokens, and a chain of k accepts min(k, 2) drafts per verify step. This checks
# launch, health wait, requests, parsing and teardown, not SGLang's numbers.
FAKE_SGLANG = r"""#!{python}
import http.server, json, math, os, sys, threading, time
from pathlib import Path

argv = sys.argv[1:]
k = int(argv[argv.index("--speculative-num-steps") + 1]) if "--speculative-num-steps" in argv else None
record = Path(os.environ["FAKE_RECORD"])
if os.environ.get("FAKE_EXIT"):
    print("fake sglang: failing on purpose", flush=True)
    sys.exit(3)
child = os.fork()
if child == 0:
    time.sleep(600)
    os._exit(0)


def running(pid):
    try:
        return Path(f"/proc/{{pid}}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


# Servers of earlier settings still running now would mean no restart between settings.
earlier = [pid for f in record.glob("*.json") for pid in json.loads(f.read_text())["pids"]]
launch = {{"pids": [os.getpid(), child], "argv": argv, "earlier_running": [p for p in earlier if running(p)]}}
(record / f"{{time.time_ns()}}.json").write_text(json.dumps(launch))
print("fake sglang: ready", k, flush=True)
bad_after = int(os.environ.get("FAKE_BAD_AFTER", "-1"))
lock, served = threading.Lock(), [0]


def answer(body):
    with lock:
        served[0] += 1
        n = served[0]
    if os.environ.get("FAKE_HANG"):
        (record / "hanging").touch()
        time.sleep(600)
    tokens = body["sampling_params"]["max_new_tokens"]
    meta = {{"id": body["rid"], "finish_reason": {{"type": "length", "length": tokens}},
            "prompt_tokens": len(body["input_ids"]), "weight_version": "default",
            "num_retractions": 0, "reasoning_tokens": 0, "completion_tokens": tokens,
            "cached_tokens": 0}}
    verify = 0
    if k is not None and not 0 <= bad_after < n:
        verify = math.ceil((tokens - 1) / (min(k, 2) + 1))
        meta.update(spec_verify_ct=verify, spec_accept_length=tokens / verify,
                    spec_num_correct_drafts=tokens - 1 - verify, spec_num_proposed_drafts=verify * k)
    time.sleep(0.002 * (verify or tokens))
    meta["e2e_latency"] = 0.002 * (verify or tokens)
    text = " ".join(map(str, body["input_ids"][-3:]))
    return {{"text": text, "output_ids": list(range(tokens)), "meta_info": meta}}


class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path == "/flush_cache":
            out = b"Cache flushed."
        elif self.path == "/generate":
            out = json.dumps(answer(json.loads(body))).encode()
        else:
            self.send_response(404)
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)


port = int(argv[argv.index("--port") + 1])
http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


@pytest.fixture
def fake(tmp_path, monkeypatch) -> Path:
    """The stand-in's path; FAKE_RECORD collects one pid file per launch."""
    path = tmp_path / "fake-sglang"
    path.write_text(FAKE_SGLANG.format(python=sys.executable))
    path.chmod(0o755)
    (tmp_path / "record").mkdir()
    monkeypatch.setenv("FAKE_RECORD", str(tmp_path / "record"))
    return path


def _fake_bench(tmp_path: Path, fake: Path, **bench) -> ServeBenchSettings:
    sglang = {"python": str(fake), "startup_timeout_s": 30, "request_timeout_s": 30}
    return _bench(
        tmp_path, **{"k": [1, 3], "max_new_tokens": 13, "warmup_requests": 1, "sglang": sglang, **bench}
    )


def _launches(tmp_path: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((tmp_path / "record").glob("*.json"))]


def _running(pids: list[int]) -> list[int]:
    """The pids among `pids` still running (zombies hold nothing and count as gone)."""
    alive = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z":
            alive.append(pid)
    return alive


def _all_gone(tmp_path: Path, fake: Path) -> None:
    pids = [pid for launch in _launches(tmp_path) for pid in launch["pids"]]
    assert pids and _running(pids) == []
    leftovers = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _mentions(p, str(fake))]
    assert _running([int(p.name) for p in leftovers]) == []  # the guard too


def _mentions(proc: Path, marker: str) -> bool:
    try:
        return marker in (proc / "cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False


PROMPTS = [BenchPrompt("held-000000", [5, 6, 7, 8]), BenchPrompt("held-000001", [9, 10, 11])]


def test_benchmark_against_a_stand_in_tears_every_server_down(tmp_path, fake):
    bench = _fake_bench(tmp_path, fake, concurrency=[1, 2])
    result = run_benchmark(MODEL, DRAFT, PROMPTS, bench, tmp_path / "logs", free_port())
    launches = _launches(tmp_path)
    assert [launch["argv"] for launch in launches] == [cmd[1:] for cmd in result["command"].values()]
    assert list(result["command"]) == ["baseline", "k=1", "k=3"]
    assert [launch["earlier_running"] for launch in launches] == [[], [], []]  # one server at a time
    rows = {(s["k"], s["concurrency"]): s for s in result["settings"]}
    assert sorted(rows) == [(1, 1), (1, 2), (3, 1), (3, 2)]
    # 13 tokens: the prefill's one, then 12 in steps of min(k, 2) + 1 tokens.
    assert rows[1, 1]["draft"]["acceptance_length"] == round(26 / 12, 4)
    assert rows[3, 2]["draft"]["acceptance_length"] == round(26 / 8, 4)
    for row in rows.values():
        base, draft = row["baseline"], row["draft"]
        assert base["requests"] == draft["requests"] == 2 and base["tokens"] == draft["tokens"] == 26
        assert row["speedup"] == round(draft["tokens_per_s"] / base["tokens_per_s"], 4)
        assert draft["same_output_as_baseline"] == 2
        assert [r["id"] for r in draft["per_request"]] == ["held-000000", "held-000001"]
    assert {p.name for p in (tmp_path / "logs").iterdir()} == {"baseline.log", "k1.log", "k3.log"}
    assert "fake sglang: ready 3" in (tmp_path / "logs" / "k3.log").read_text()
    _all_gone(tmp_path, fake)


def test_a_failure_midway_tears_the_group_down(tmp_path, fake, monkeypatch):
    # The draft server stops reporting verify steps after 3 answers (warmup + 2), with 2 in flight.
    monkeypatch.setenv("FAKE_BAD_AFTER", "3")
    bench = _fake_bench(tmp_path, fake, k=[3], concurrency=[1, 2])
    with pytest.raises(
        ServeBenchError, match="no meta_info.spec_verify_ct: the draft server did not speculate"
    ):
        run_benchmark(MODEL, DRAFT, PROMPTS, bench, tmp_path / "logs", free_port())
    assert len(_launches(tmp_path)) == 2  # the baseline ran through, the draft failed midway
    _all_gone(tmp_path, fake)


def test_a_dead_server_is_reported_with_its_log(tmp_path, fake, monkeypatch):
    monkeypatch.setenv("FAKE_EXIT", "1")
    bench = _fake_bench(tmp_path, fake)
    port = free_port()
    cmd, url, log_path = (
        launch_command(MODEL, bench.server, port),
        f"http://127.0.0.1:{port}",
        tmp_path / "b.log",
    )
    with pytest.raises(
        ServerError, match=rf"exited with code 3 .*last lines of {log_path}:\nfake sglang: fail"
    ):
        run_server(cmd, url, PROMPTS, bench, setting=None, log_path=log_path)


# A job process: the draftsmith signal handlers and one benchmark, as the rule runs it.
JOB = r"""
import pickle, sys
from pathlib import Path

from draftsmith.runtime.jobs import install_signal_handlers
from draftsmith.serve_bench.stage import BenchPrompt, run_benchmark

bench = pickle.loads(Path(sys.argv[1]).read_bytes())  # the settings, pickled as Snakemake hands them
port, logs = int(sys.argv[2]), Path(sys.argv[3])
install_signal_handlers()
run_benchmark("/models/target", Path("/drafts/d"), [BenchPrompt("p", [1, 2])], bench, logs, port)
"""


def test_sigterm_with_a_request_in_flight_tears_the_group_down(tmp_path, fake):
    bench = _fake_bench(tmp_path, fake, k=[1])
    env = {**os.environ, "FAKE_HANG": "1"}
    settings = tmp_path / "settings.pickle"
    settings.write_bytes(pickle.dumps(bench))
    cmd = [sys.executable, "-c", JOB, str(settings), str(free_port()), str(tmp_path / "logs")]
    job = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "record" / "hanging").exists():
            assert job.poll() is None and time.monotonic() < deadline, job.stdout.read().decode()
            time.sleep(0.1)
        job.send_signal(signal.SIGTERM)
        assert job.wait(timeout=30) != 0  # does not wait out the 30 s request timeout
    finally:
        job.kill()
    _all_gone(tmp_path, fake)


# --- the stage ----------------------------------------------------------------------------
def test_stage_writes_report_manifest_and_logs(tmp_path, fake, demo_model_dir):
    sglang = {"python": str(fake), "startup_timeout_s": 30, "request_timeout_s": 30}
    config = _config(tmp_path, k=[2], max_new_tokens=7, warmup_requests=0, sglang=sglang)
    config["model"]["source"]["path"] = str(demo_model_dir)
    model = tmp_path / "artifacts" / "model" / "model.json"
    model.parent.mkdir(parents=True)
    model.write_text(json.dumps({"hf_dir": str(demo_model_dir)}))
    draft = _draft_dir(tmp_path)
    out = tmp_path / "artifacts" / "serve_bench" / "key"
    (out / "logs").mkdir(parents=True)
    (out / "logs" / "k9.log").write_text("a server log of an earlier, failed attempt\n")
    outputs = {"json": str(out / "serve_benchmark.json"), "md": str(out / "serve_benchmark.md"),
               "manifest": str(out / "manifest.json")}  # fmt: skip
    train, responses = write_training(tmp_path, {"train-000000": "Name three animals."})
    inputs = {"model": str(model), "draft_config": str(draft / "config.json")}
    report = _run_stage(config, inputs | {"merged": str(train), "responses": [str(responses)]}, outputs)

    from draftsmith.store.plan import plan_for

    assert json.loads(Path(outputs["json"]).read_text()) == report
    assert report["key"] == plan_for(config).serve_bench.key
    assert (report["prompt_set"], report["prompts"], report["max_new_tokens"]) == ("held", 2, 7)
    (row,) = report["settings"]
    shape = {"num_steps", "topk", "num_draft_tokens"}
    assert set(row) == {"setting", "k", *shape, "concurrency", "baseline", "draft", "speedup"}
    assert set(row["baseline"]) >= {"tokens_per_s", "requests", "tokens", "seconds"}
    assert row["draft"]["acceptance_length"] == round(14 / 4, 4)  # 7 tokens: 1 + 2 steps of 3
    k2 = report["command"]["k=2"]
    assert k2[k2.index("--speculative-draft-model-path") + 1] == str(draft)
    assert "| k=2 | 1 |" in Path(outputs["md"]).read_text()
    assert "search" not in report  # no settings search served here
    written = manifest.read(outputs["manifest"])
    assert written["stage"] == "serve_bench" and written["key"] == report["key"]
    assert set(written["files"]) == {
        "serve_benchmark.json",
        "serve_benchmark.md",
        "logs/baseline.log",
        "logs/k2.log",
    }
    assert manifest.check(Path(outputs["manifest"])) == []
    _all_gone(tmp_path, fake)


def test_stage_refuses_a_prompt_over_the_context(tmp_path, fake, demo_model_dir):
    config = _config(tmp_path, max_new_tokens=100, sglang={"python": str(fake), "context_length": 64})
    config["model"]["source"]["path"] = str(demo_model_dir)
    model = tmp_path / "model.json"
    model.write_text(json.dumps({"hf_dir": str(demo_model_dir)}))
    train, responses = write_training(tmp_path, {"train-000000": "Name three animals."})
    inputs = {"model": str(model), "draft_config": str(_draft_dir(tmp_path) / "config.json")}
    inputs |= {"merged": str(train), "responses": [str(responses)]}
    with pytest.raises(
        ServeBenchError, match=r"prompt held-000000 of evaluate.prompt_sets.held: \d+ tokens \+ "
    ):
        _run_stage(config, inputs, {"json": str(tmp_path / "out" / "serve_benchmark.json")})
    assert _launches(tmp_path) == []  # refused before any server started


def test_stage_refuses_a_prompt_the_draft_was_trained_on(tmp_path, fake, demo_model_dir):
    config = _config(tmp_path, sglang={"python": str(fake)})
    config["model"]["source"]["path"] = str(demo_model_dir)
    model = tmp_path / "model.json"
    model.write_text(json.dumps({"hf_dir": str(demo_model_dir)}))
    train, responses = write_training(tmp_path, {"train-000007": "count to FIVE."})  # held row 1
    inputs = {"model": str(model), "draft_config": str(_draft_dir(tmp_path) / "config.json")}
    inputs |= {"merged": str(train), "responses": [str(responses)]}
    with pytest.raises(OverlapError, match=r"prompt set 'held' row held-000001 .* train-000007"):
        _run_stage(config, inputs, {"json": str(tmp_path / "out" / "serve_benchmark.json")})
    assert _launches(tmp_path) == []  # refused before any server started


# --- the settings search's best settings ----------------------------------------------------
SEARCHED = [Speculation(3, 2, 6), Speculation.chain(3), Speculation.chain(2)]  # k=3 is configured too


def test_search_settings_join_the_configured_chains_once(tmp_path):
    commands = build_commands(MODEL, DRAFT, _bench(tmp_path, k=[1, 3]), 31000, SEARCHED)
    assert list(commands) == ["baseline", "k=1", "k=3", "tree 3/2/6", "k=2"]
    assert commands["tree 3/2/6"] == BASE + TREE_FLAGS
    assert commands["k=2"] == BASE + speculative_flags(Speculation.chain(2), "EAGLE3", DRAFT)


def test_a_search_setting_no_tree_can_hold_is_refused(tmp_path):
    with pytest.raises(ServeBenchError, match=r"num_draft_tokens must be between 2 and 11 .* got 20"):
        build_commands(MODEL, DRAFT, _bench(tmp_path), 31000, [Speculation(3, 2, 20)])


def test_search_settings_served_against_a_stand_in(tmp_path, fake):
    bench = _fake_bench(tmp_path, fake, k=[1])
    result = run_benchmark(MODEL, DRAFT, PROMPTS, bench, tmp_path / "logs", free_port(), SEARCHED[:1])
    assert list(result["command"]) == ["baseline", "k=1", "tree 3/2/6"]
    assert [launch["earlier_running"] for launch in _launches(tmp_path)] == [[], [], []]
    tree = next(row for row in result["settings"] if row["setting"] == "tree 3/2/6")
    assert (tree["k"], tree["num_steps"], tree["topk"], tree["num_draft_tokens"]) == (None, 3, 2, 6)
    # 13 tokens: the prefill's one, then 12 in steps of min(num_steps, 2) + 1 tokens.
    assert tree["draft"]["acceptance_length"] == round(26 / 8, 4)
    assert "fake sglang: ready 3" in (tmp_path / "logs" / "tree3-2-6.log").read_text()
    _all_gone(tmp_path, fake)


def test_search_verdict_names_the_fastest_served():
    rows = [
        {"setting": label, "concurrency": c, "speedup": x}
        for label, c, x in [("k=3", 1, 1.5), ("tree 3/2/6", 1, 1.4), ("k=2", 1, 1.5), ("tree 3/2/6", 8, 3.0)]
    ]
    search = {"key": "f" * 16, "recommended": {"setting": "tree 3/2/6"}}
    verdict = metrics.search_verdict(rows, search, ["tree 3/2/6", "k=3", "k=2"])
    assert verdict == {
        "key": "f" * 16,
        "recommended": "tree 3/2/6",
        "served": ["tree 3/2/6", "k=3", "k=2"],
        "concurrency": 1,  # single stream, as the search measured
        "speedups": {"tree 3/2/6": 1.4, "k=3": 1.5, "k=2": 1.5},
        "fastest": "k=3",  # ties go to the better search rank
        "confirmed": False,
    }
    rows[1]["speedup"] = 1.6
    assert metrics.search_verdict(rows, search, ["tree 3/2/6", "k=3", "k=2"])["confirmed"] is True


def test_stage_serves_the_search_best_and_says_what_it_confirmed(tmp_path, fake, demo_model_dir):
    from search.test_summary import fixture_search

    sglang = {"python": str(fake), "startup_timeout_s": 30, "request_timeout_s": 30}
    config = _config(tmp_path, k=[2], max_new_tokens=7, warmup_requests=0, sglang=sglang)
    config["search"]["confirm_top"] = 2
    config["model"]["source"]["path"] = str(demo_model_dir)
    model = tmp_path / "model.json"
    model.write_text(json.dumps({"hf_dir": str(demo_model_dir)}))
    search = tmp_path / "search.json"
    search.write_text(json.dumps(fixture_search()))  # best two: tree 3/2/6, k=3
    out = tmp_path / "out"
    names = {"json": "serve_benchmark.json", "md": "serve_benchmark.md", "manifest": "manifest.json"}
    outputs = {role: str(out / name) for role, name in names.items()}
    train, responses = write_training(tmp_path, {"train-000000": "Name three animals."})
    inputs = {
        "model": str(model),
        "draft_config": str(_draft_dir(tmp_path) / "config.json"),
        "search": [str(search)],
    }
    report = _run_stage(config, inputs | {"merged": str(train), "responses": [str(responses)]}, outputs)
    assert list(report["command"]) == ["baseline", "k=2", "tree 3/2/6", "k=3"]
    verdict = report["search"]
    assert (verdict["recommended"], verdict["served"]) == ("tree 3/2/6", ["tree 3/2/6", "k=3"])
    assert verdict["fastest"] in verdict["served"] and verdict["confirmed"] is (
        verdict["fastest"] == "tree 3/2/6"
    )
    assert "Settings search `0123456789abcdef`: its best 2 settings served" in Path(outputs["md"]).read_text()
    logs = {name for name in manifest.read(outputs["manifest"])["files"] if name.startswith("logs/")}
    assert logs == {"logs/baseline.log", "logs/k2.log", "logs/tree3-2-6.log", "logs/k3.log"}
    _all_gone(tmp_path, fake)
