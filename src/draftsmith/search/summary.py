"""What others read of search.json: its Markdown (search.md and the report's section), with
the serving benchmark's verdict on the recommendation when it ran, and the best settings
the serving benchmark serves.

No torch here: the report and the serving benchmark import this module.
"""

from __future__ import annotations

from draftsmith.evaluate import launch_markdown
from draftsmith.formats.markdown import fmt, table
from draftsmith.speculation import Speculation


def top_settings(search: dict, count: int) -> list[Speculation]:
    """The first `count` settings of the search's final ranking."""
    return [Speculation.of(row) for row in search["table"][:count]]


def search_markdown(search: dict, serving: dict | None = None) -> str:
    """The search as a Markdown section; `serving` is the serving benchmark's `search`
    verdict (serve_benchmark.json), when it served the search's settings."""
    parts = [
        f"## Settings search (prompt set `{search['prompt_set']}`)\n",
        _setup(search),
        _skipped(search),
        _table(search),
        "### Recommended by the search\n",
        _recommended(search["recommended"]),
        _verdict(search, serving),
    ]
    return "\n".join(part for part in parts if part)


def _setup(search: dict) -> str:
    grid = search["grid_lists"]
    rounds = ", ".join(
        f"{len(r['settings'])} setting{'s' if len(r['settings']) > 1 else ''} on {r['prompts']}"
        for r in search["rounds"]
    )
    return (
        f"Successive halving over num_steps {_listed(grid['num_steps'])} x topk {_listed(grid['topk'])} x "
        f"num_draft_tokens {_listed(grid['num_draft_tokens'])}: {len(search['grid'])} settings, each round "
        f"keeping the best 1/{search['eta']} by speed-up over the target alone on the same prompts and "
        f"doubling them. Rounds (settings on prompts of {search['prompts']}): {rounds}. Every decode was "
        f"checked lossless against the target's greedy output. Search key `{search['key']}`: device "
        f"{search['device']}, dtype {search['dtype']}, up to {search['max_new_tokens']} new tokens per "
        f"prompt, {search['decodes']} timed decodes in {fmt(search['wall_s'], 1)} s.\n"
    )


def _listed(values: list[int]) -> str:
    return ", ".join(map(str, values))


def _skipped(search: dict) -> str:
    if not search["skipped"]:
        return ""
    lines = [f"- {Speculation.of(skipped).shape}: {skipped['reason']}" for skipped in search["skipped"]]
    return "Skipped (num_steps/topk/num_draft_tokens):\n\n" + "\n".join(lines) + "\n"


def _table(search: dict) -> str:
    headers = ["rank", "setting", "round reached", "prompts", "acceptance length", "tokens/s"]
    headers += ["baseline tokens/s", "speed-up"]
    rows = [
        [
            r["rank"],
            r["setting"],
            r["round"],
            r["prompts"],
            fmt(r["acceptance_length"]),
            fmt(r["tokens_per_s"], 1),
            fmt(r["baseline_tokens_per_s"], 1),
            f"{r['speedup']:.2f}x",
        ]
        for r in search["table"]
    ]
    return table(headers, rows)


def _recommended(recommended: dict) -> str:
    slower = (
        " No setting of the grid beat the target alone: serving without the draft is faster on these prompts."
        if recommended["speedup"] <= 1
        else ""
    )
    return (
        f"{recommended['setting']}: {recommended['speedup']:.2f}x at acceptance length "
        f"{fmt(recommended['acceptance_length'])} on all {recommended['prompts']} prompts.{slower} "
        + launch_markdown(recommended)
    )


def _verdict(search: dict, serving: dict | None) -> str:
    if serving is None:
        return ""
    fastest, recommended = serving["fastest"], search["recommended"]["setting"]
    measured = (
        f"of the search's best {len(serving['served'])} served by SGLang at concurrency "
        f"{serving['concurrency']} ({_speedups(serving)})"
    )
    if serving["confirmed"]:
        return f"**Confirmed by the serving benchmark:** {recommended} is the fastest {measured}.\n"
    command = next(r["command"] for r in search["table"] if r["setting"] == fastest)
    return (
        f"**Not confirmed by the serving benchmark:** {fastest}, not {recommended}, is the fastest "
        f"{measured}; served, it is the better choice:\n\n`{command}`\n"
    )


def _speedups(serving: dict) -> str:
    return ", ".join(f"{label} {fmt(speedup)}x" for label, speedup in serving["speedups"].items())
