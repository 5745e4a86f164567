"""Rule `search`'s stage on the real demo model and an exported draft: every grid setting
decoded losslessly, halved round by round, ranked, and recommended as an SGLang launch."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from evaluate.test_evaluate import PROMPTS, export_dir, model, model_info, stage_inputs  # noqa: F401 (fixtures)

from draftsmith.formats.prompt_sets import OverlapError
from draftsmith.search.stage import search
from draftsmith.store import manifest
from draftsmith.store.plan import plan_for
from draftsmith.workflow import configure

SET = [*PROMPTS, "Count to five.", "Name a fruit."]
# With the exported draft's 2-token vocabulary and 2 TTT steps: chains 1 and 2, trees
# 1/2/3, 2/2/3 and 2/2/4; num_steps 3, topk 3 and the 1/2/4 tree are skipped.
SEARCH = {"num_steps": [1, 2, 3], "topk": [1, 2, 3], "num_draft_tokens": [3, 4], "first_prompts": 1, "eta": 2}
MEASURED = ["k=1", "tree 1/2/3", "k=2", "tree 2/2/3", "tree 2/2/4"]


def _setup(tmp: Path, demo_model_dir: Path, model_info: dict, export_dir: Path, trained: list[str]):  # noqa: F811
    config, inputs = stage_inputs(
        tmp,
        demo_model_dir,
        model_info,
        export_dir,
        trained,
        SET,
        train={"draft_vocab_size": 2, "ttt_steps": 2},
        search=SEARCH,
    )
    return config, inputs, plan_for(config).search.outputs


def run_search(config: dict, inputs: dict, outputs: dict) -> dict:
    """The job as the rule runs it: the search's settings and artifact, the evaluator's
    settings and the planned export, as `workflow.configure` resolves them."""
    resolved = configure(config)
    plan = resolved.plan
    return search(
        resolved.search, plan.search, inputs, outputs, evaluate=resolved.evaluate, export=plan.export
    )


def test_search_decodes_the_grid_and_recommends_a_launch(tmp_path, demo_model_dir, model_info, export_dir):  # noqa: F811
    config, inputs, outputs = _setup(tmp_path, demo_model_dir, model_info, export_dir, ["How do tides work?"])
    result = run_search(config, inputs, outputs)
    assert json.loads(Path(outputs["json"]).read_text()) == result
    assert result["key"] == plan_for(config).search.key and result["lossless"] is True
    assert (result["prompt_set"], result["prompts"], result["max_new_tokens"]) == ("tiny", 4, 8)
    assert [g["setting"] for g in result["grid"]] == MEASURED
    assert len(result["skipped"]) == 10 and all(s["reason"] for s in result["skipped"])

    # 5 settings on 1 prompt, the best 3 on 2, the best 2 on all 4: each prompt's baseline
    # once, each survivor only on the prompts new to its round.
    rounds = result["rounds"]
    assert [(r["prompts"], len(r["settings"])) for r in rounds] == [(1, 5), (2, 3), (4, 2)]
    for before, after in zip(rounds, rounds[1:], strict=False):  # the best of each round go on
        assert set(after["settings"]) == set(before["settings"][: len(after["settings"])])
    assert result["decodes"] == 4 + 5 + 3 + 2 * 2

    table = result["table"]
    assert [row["rank"] for row in table] == [1, 2, 3, 4, 5]
    assert sorted(row["setting"] for row in table) == sorted(MEASURED)
    reached = {row["setting"]: row["round"] for row in table}
    for r in rounds:
        assert all(reached[label] >= r["round"] for label in r["settings"])
    order = [(row["round"], row["speedup"]) for row in table]
    assert order == sorted(order, key=lambda item: (-item[0], -item[1]))
    for row in table:
        assert row["prompts"] == rounds[row["round"] - 1]["prompts"]
        assert row["speedup"] == pytest.approx(row["tokens_per_s"] / row["baseline_tokens_per_s"])
        assert 1 <= row["acceptance_length"] <= row["num_steps"] + 1
        assert row["speedup"] == pytest.approx(rounds[row["round"] - 1]["speedups"][row["setting"]])
    # Lossless: every setting made the target's own tokens on the same prompts.
    for prompts in (1, 2, 4):
        assert len({row["tokens"] for row in table if row["prompts"] == prompts}) <= 1

    recommended = result["recommended"]
    top = table[0]
    assert recommended["setting"] == top["setting"] and recommended["speedup"] == top["speedup"]
    assert recommended["prompts"] == 4 and top["round"] == 3
    shape = [recommended[k] for k in ("num_steps", "topk", "num_draft_tokens")]
    flags = "--speculative-num-steps {} --speculative-eagle-topk {} --speculative-num-draft-tokens {}"
    assert recommended["command"].endswith(flags.format(*shape)) and recommended["command"] == top["command"]
    assert recommended["command"].startswith('python3 -m sglang.launch_server --model-path "$TARGET_MODEL" ')
    assert recommended["placeholders"]["DRAFT_DIR"] == str(
        plan_for(config).export.path("sglang_config").parent
    )
    assert recommended["checked_by_sglang"] is (importlib.util.find_spec("sglang") is not None)

    text = Path(outputs["md"]).read_text()
    assert text.startswith(f"# Settings search `{result['key']}`")
    assert f"| 1 | {top['setting']} | 3 | 4 |" in text and f"`{recommended['command']}`" in text
    written = manifest.read(outputs["manifest"])
    assert written["stage"] == "search" and set(written["files"]) == {"search.json", "search.md"}
    assert manifest.check(Path(outputs["manifest"])) == []


def test_search_refuses_a_prompt_the_draft_was_trained_on(tmp_path, demo_model_dir, model_info, export_dir):  # noqa: F811
    trained = ["count to FIVE."]  # row 2 of the searched set, up to case
    config, inputs, outputs = _setup(tmp_path, demo_model_dir, model_info, export_dir, trained)
    with pytest.raises(OverlapError, match=r"prompt set 'tiny' row tiny-000002 .* chat-000000"):
        run_search(config, inputs, outputs)
    assert not Path(outputs["json"]).parent.exists()
