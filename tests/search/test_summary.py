"""search.json's Markdown and best settings, and how the serving verdict reads in it.

`fixture_search` is a search.json in the stage's schema (the real stage's output is checked
against the same Markdown in test_search.py); the report and serving tests use it too."""

from __future__ import annotations

from draftsmith.search import search_markdown, top_settings
from draftsmith.speculation import Speculation

COMMAND = (
    'python3 -m sglang.launch_server --model-path "$TARGET_MODEL" --host 127.0.0.1 --port 30000 '
    '--tp-size 1 --speculative-algorithm EAGLE3 --speculative-draft-model-path "$DRAFT_DIR" '
    "--speculative-num-steps {} --speculative-eagle-topk {} --speculative-num-draft-tokens {}"
)


def _row(rank: int, shape: tuple[int, int, int], reached: int, prompts: int, speedup: float) -> dict:
    num_steps, topk, tokens = shape
    label = f"k={num_steps}" if topk == 1 else f"tree {num_steps}/{topk}/{tokens}"
    return {
        "rank": rank,
        "setting": label,
        "num_steps": num_steps,
        "topk": topk,
        "num_draft_tokens": tokens,
        "round": reached,
        "prompts": prompts,
        "acceptance_length": 1.5,
        "tokens": 96 * prompts,
        "seconds": 2.0 * prompts / speedup,
        "tokens_per_s": 48.0 * speedup,
        "baseline_tokens_per_s": 48.0,
        "speedup": speedup,
        "command": COMMAND.format(*shape),
    }


def fixture_search() -> dict:
    """Four settings, two rounds on a 2-prompt set: tree 3/2/6 recommended."""
    table = [
        _row(1, (3, 2, 6), 2, 2, 1.4),
        _row(2, (3, 1, 4), 2, 2, 1.3),
        _row(3, (2, 1, 3), 1, 1, 1.2),
        _row(4, (2, 2, 4), 1, 1, 0.9),
    ]
    grid = [{k: r[k] for k in ("setting", "num_steps", "topk", "num_draft_tokens")} for r in table]
    top = table[0]
    return {
        "key": "0123456789abcdef",
        "device": "cpu (2 cores, 2 threads)",
        "dtype": "float32",
        "max_new_tokens": 48,
        "prompt_set": "heldout",
        "prompts": 2,
        "first_prompts": 1,
        "eta": 2,
        "grid_lists": {"num_steps": [2, 3], "topk": [1, 2], "num_draft_tokens": [3, 4, 6]},
        "grid": grid,
        "skipped": [{"num_steps": 2, "topk": 2, "num_draft_tokens": 6, "reason": "too many tokens"}],
        "rounds": [
            {"round": 1, "prompts": 1, "settings": [r["setting"] for r in table], "speedups": {}},
            {"round": 2, "prompts": 2, "settings": [r["setting"] for r in table[:2]], "speedups": {}},
        ],
        "table": table,
        "decodes": 8,
        "wall_s": 12.5,
        "lossless": True,
        "recommended": {
            **{k: top[k] for k in ("setting", "num_steps", "topk", "num_draft_tokens", "speedup")},
            **{k: top[k] for k in ("acceptance_length", "prompts", "command")},
            "flags": ["--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3"],
            "placeholders": {"TARGET_MODEL": "/models/target", "DRAFT_DIR": "artifacts/export/k/sglang"},
            "checked_by_sglang": False,
        },
    }


def verdict(fastest: str) -> dict:
    """serve_benchmark.json's `search` (serve_bench.metrics.search_verdict) for the fixture."""
    return {
        "key": "0123456789abcdef",
        "recommended": "tree 3/2/6",
        "served": ["tree 3/2/6", "k=3"],
        "concurrency": 1,
        "speedups": {"tree 3/2/6": 1.8, "k=3": 2.1} if fastest == "k=3" else {"tree 3/2/6": 1.8, "k=3": 1.6},
        "fastest": fastest,
        "confirmed": fastest == "tree 3/2/6",
    }


def test_top_settings_follow_the_ranking():
    search = fixture_search()
    assert top_settings(search, 3) == [Speculation(3, 2, 6), Speculation(3, 1, 4), Speculation(2, 1, 3)]
    assert top_settings(search, 0) == [] and len(top_settings(search, 9)) == 4


def test_markdown_has_the_table_in_ranking_order_and_the_command():
    search = fixture_search()
    text = search_markdown(search)
    assert text.startswith("## Settings search (prompt set `heldout`)")
    rows = [line for line in text.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert [row.split(" | ")[1] for row in rows] == ["tree 3/2/6", "k=3", "k=2", "tree 2/2/4"]
    assert rows[0] == "| 1 | tree 3/2/6 | 2 | 2 | 1.50 | 67.2 | 48.0 | 1.40x |"
    assert "Rounds (settings on prompts of 2): 4 settings on 1, 2 settings on 2." in text
    assert "- 2/2/6: too many tokens" in text
    assert "tree 3/2/6: 1.40x at acceptance length 1.50 on all 2 prompts." in text
    assert f"`{search['recommended']['command']}`" in text
    assert "Checked by SGLang's own argument parser: no" in text
    assert "serving benchmark" not in text  # no verdict without a serving run


def test_markdown_says_whether_serving_confirmed_the_recommendation():
    search = fixture_search()
    confirmed = search_markdown(search, verdict("tree 3/2/6"))
    assert (
        "**Confirmed by the serving benchmark:** tree 3/2/6 is the fastest of the search's best 2"
        in confirmed
    )
    assert "(tree 3/2/6 1.80x, k=3 1.60x)" in confirmed
    refuted = search_markdown(search, verdict("k=3"))
    assert "**Not confirmed by the serving benchmark:** k=3, not tree 3/2/6, is the fastest" in refuted
    assert f"`{COMMAND.format(3, 1, 4)}`" in refuted  # the served winner's own launch


def test_a_grid_slower_than_the_target_says_so():
    search = fixture_search()
    search["recommended"]["speedup"] = 0.8
    assert "No setting of the grid beat the target alone" in search_markdown(search)
