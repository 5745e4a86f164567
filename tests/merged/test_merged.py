"""draftsmith.merged.merge (seeded caps and shuffle) and draftsmith.merged.data_report (the data report)."""

from __future__ import annotations

import copy

from draftsmith.merged import data_report as report
from draftsmith.merged import merge


def samples(name: str, count: int) -> list[dict]:
    return [{"id": f"{name}-{i}", "dataset": name, "input_ids": [i]} for i in range(count)]


def ids(records: list[dict]) -> list[str]:
    return [r["id"] for r in records]


def corpus() -> dict[str, list[dict]]:
    return {"chat": samples("chat", 50), "code": samples("code", 30), "math": samples("math", 20)}


def test_merge_keeps_everything_without_caps():
    merged, taken = merge.merge(corpus(), {}, seed=0)
    assert taken == {"chat": 50, "code": 30, "math": 20}
    assert sorted(ids(merged)) == sorted(ids([s for group in corpus().values() for s in group]))


def test_merge_is_deterministic_for_a_seed():
    first, taken_first = merge.merge(corpus(), {"chat": 10}, seed=3)
    second, taken_second = merge.merge(corpus(), {"chat": 10}, seed=3)
    assert ids(first) == ids(second)
    assert taken_first == taken_second


def test_merge_order_is_independent_of_input_dict_order():
    forward = corpus()
    backward = dict(reversed(list(forward.items())))
    assert ids(merge.merge(forward, {"code": 5}, seed=1)[0]) == ids(
        merge.merge(backward, {"code": 5}, seed=1)[0]
    )


def test_merge_shuffles_differently_for_another_seed():
    zero, _ = merge.merge(corpus(), {}, seed=0)
    one, _ = merge.merge(corpus(), {}, seed=1)
    assert ids(zero) != ids(one)
    assert sorted(ids(zero)) == sorted(ids(one))
    # The shuffle really mixes datasets rather than concatenating them in order.
    assert ids(zero) != ids([s for name in sorted(corpus()) for s in corpus()[name]])


def test_caps_subsample_deterministically():
    capped, taken = merge.merge(corpus(), {"chat": 10, "math": 100}, seed=5)
    assert taken == {"chat": 10, "code": 30, "math": 20}  # a cap above the size keeps everything
    chat = [r for r in capped if r["dataset"] == "chat"]
    assert len(chat) == 10 and len(set(ids(chat))) == 10
    assert set(ids(chat)) <= set(ids(samples("chat", 50)))
    again, _ = merge.merge(corpus(), {"chat": 10, "math": 100}, seed=5)
    assert ids(again) == ids(capped)
    # Another seed draws another subsample, not just another order.
    other, _ = merge.merge(corpus(), {"chat": 10}, seed=6)
    assert {r["id"] for r in other if r["dataset"] == "chat"} != set(ids(chat))


def test_cap_equal_to_size_keeps_everything():
    merged, taken = merge.merge({"chat": samples("chat", 10)}, {"chat": 10}, seed=0)
    assert taken == {"chat": 10}
    assert sorted(ids(merged)) == sorted(ids(samples("chat", 10)))


def test_adding_a_dataset_does_not_change_another_datasets_subsample():
    def chosen(per_dataset):
        # The new datasets are capped too, so they draw from a generator before chat and code do.
        merged, _ = merge.merge(per_dataset, {"aaa": 5, "chat": 7, "code": 4, "poems": 2}, seed=11)
        return {name: {r["id"] for r in merged if r["dataset"] == name} for name in ("chat", "code")}

    before = chosen(corpus())
    bigger = corpus() | {"aaa": samples("aaa", 40), "poems": samples("poems", 9)}
    assert chosen(bigger) == before


def test_merge_does_not_mutate_its_inputs():
    per_dataset = corpus()
    snapshot = copy.deepcopy(per_dataset)
    merge.merge(per_dataset, {"chat": 3}, seed=2)
    assert per_dataset == snapshot


# --- report --------------------------------------------------------------------
def responses_stats(rows: int, bad: int, cost: float, completion: int) -> dict:
    return {
        "rows": rows,
        "bad_rows": bad,
        "samples": rows - bad,
        "completion_tokens": completion,
        "cost_usd": cost,
    }


def tokens_stats(
    tokens: int, supervised: int, backend: int, rate: float | None, special: tuple[int, int] = (0, 0)
) -> dict:
    return {
        "tokens": tokens,
        "supervised_tokens": supervised,
        "truncated": 1,
        "dropped_no_supervised": 0,
        "with_backend_ids": backend,
        "roundtrip_mismatch_rate": rate,
        "prompts_with_special_text": special[0],
        "replies_with_special_text": special[1],
    }


def data_report(rows: list[dict], excluded: list[str] | None = None) -> dict:
    return {
        "experiment": "demo",
        "key": "0123456789abcdef",
        "seed": 0,
        "max_length": 512,
        "excluded": excluded or [],
        "datasets": rows,
        "total": report.totals(rows),
    }


def test_dataset_row_maps_stats_to_columns():
    row = report.dataset_row(
        "chat", responses_stats(40, 2, 0.25, 900), tokens_stats(12345, 4000, 38, 0.0), merged=30
    )
    assert row["dataset"] == "chat"
    assert row["generated"] == 38 and row["merged"] == 30 and row["dropped"] == 0
    assert row["roundtrip_mismatch_rate"] == 0.0
    assert {key for key, _ in report.COLUMNS} <= set(row)


def test_conversation_figures_per_dataset_and_in_total():
    turns = {"conversations": 10, "regenerated_turns": 25, "tool_calls_matched": 4, "ended_early": 3}
    conv = report.dataset_row(
        "conv",
        responses_stats(10, 0, 0.0, 500) | turns | {"with_reasoning": 7},
        tokens_stats(2000, 500, 25, 0.0),
        20,
    )
    assert (conv["turns_per_conversation"], conv["supervised_share"]) == (2.5, 0.25)
    assert (conv["tool_calls_matched"], conv["ended_early"], conv["with_reasoning"]) == (4, 3, 7)
    # A manifest from before conversations were counted: one turn per prompt, nothing matched.
    chat = report.dataset_row("chat", responses_stats(40, 0, 0.0, 100), tokens_stats(1000, 250, 40, 0.0), 40)
    assert (chat["regenerated_turns"], chat["turns_per_conversation"], chat["ended_early"]) == (40, 1.0, 0)
    total = report.totals([conv, chat])
    assert (total["regenerated_turns"], total["conversations"], total["ended_early"]) == (65, 50, 3)
    assert total["turns_per_conversation"] == 1.3 and total["supervised_share"] == 0.25
    assert "| turns/conversation |" in report.markdown(data_report([conv, chat]))


def test_totals_sum_and_weight_the_roundtrip_rate():
    rows = [
        report.dataset_row("chat", responses_stats(40, 2, 0.1, 100), tokens_stats(1000, 400, 30, 0.1), 30),
        report.dataset_row("code", responses_stats(20, 0, 0.2, 200), tokens_stats(3000, 900, 10, 0.5), 20),
        report.dataset_row("math", responses_stats(10, 1, 0.0, 50), tokens_stats(500, 100, 0, None), 9),
    ]
    total = report.totals(rows)
    assert total["dataset"] == "total"
    assert total["rows"] == 70 and total["bad_rows"] == 3 and total["generated"] == 67
    assert total["merged"] == 59 and total["tokens"] == 4500 and total["supervised_tokens"] == 1400
    assert total["truncated"] == 3 and total["completion_tokens"] == 350
    assert total["cost_usd"] == 0.3
    # Weighted by samples with backend ids; datasets never checked do not dilute it.
    assert abs(total["roundtrip_mismatch_rate"] - (0.1 * 30 + 0.5 * 10) / 40) < 1e-12


def test_markdown_renders_a_table_with_a_total_row():
    rows = [
        report.dataset_row("chat", responses_stats(40, 2, 0.0, 100), tokens_stats(12345, 4000, 0, None), 30),
        report.dataset_row("code", responses_stats(1500, 0, 2.5, 200), tokens_stats(300, 90, 5, 0.2), 20),
    ]
    text = report.markdown(data_report(rows, excluded=["math"]))
    lines = text.splitlines()
    assert lines[0] == "# Data report: demo"
    assert "merged key `0123456789abcdef`, seed 0, max_length 512" in text
    table = [line for line in lines if line.startswith("|")]
    assert len(table) == 2 + len(rows) + 1  # header, rule, one per dataset, total
    header = [cell.strip() for cell in table[0].strip("|").split("|")]
    assert header == [title for _, title in report.COLUMNS]
    assert table[1] == "|" + "|".join("---" for _ in report.COLUMNS) + "|"
    assert all(line.count("|") == len(report.COLUMNS) + 1 for line in table)

    cells = {row[0]: row for row in ([c.strip() for c in line.strip("|").split("|")] for line in table[2:])}
    assert list(cells) == ["chat", "code", "total"]
    column = {key: i for i, (key, _) in enumerate(report.COLUMNS)}
    assert cells["chat"][column["tokens"]] == "12,345"
    assert cells["chat"][column["roundtrip_mismatch_rate"]] == "n/a"
    assert cells["code"][column["rows"]] == "1,500"
    assert cells["code"][column["roundtrip_mismatch_rate"]] == "0.2000"
    assert cells["code"][column["cost_usd"]] == "2.50"
    assert cells["total"][column["rows"]] == "1,540"
    assert cells["total"][column["tokens"]] == "12,645"
    assert cells["total"][column["roundtrip_mismatch_rate"]] == "0.2000"
    assert cells["total"][column["cost_usd"]] == "2.50"
    assert lines[-1] == "Excluded from the merge: math"
    assert text.endswith("\n")


def test_markdown_shows_na_when_no_dataset_was_round_trip_checked():
    rows = [
        report.dataset_row("chat", responses_stats(4, 0, 0.0, 10), tokens_stats(100, 40, 0, None), 4),
        report.dataset_row("math", responses_stats(3, 0, 0.0, 10), tokens_stats(90, 30, 0, None), 3),
    ]
    built = data_report(rows)
    assert built["total"]["roundtrip_mismatch_rate"] is None
    text = report.markdown(built)
    total_line = next(line for line in text.splitlines() if line.startswith("| total |"))
    cells = [c.strip() for c in total_line.strip("|").split("|")]
    assert cells[[k for k, _ in report.COLUMNS].index("roundtrip_mismatch_rate")] == "n/a"
    assert "Excluded from the merge" not in text


def test_special_token_text_counts_per_dataset_and_in_total():
    rows = [
        report.dataset_row(
            "chat", responses_stats(40, 0, 0.0, 100), tokens_stats(900, 300, 0, None, (2, 5)), 40
        ),
        report.dataset_row(
            "code", responses_stats(20, 0, 0.0, 100), tokens_stats(800, 200, 0, None, (1, 0)), 20
        ),
    ]
    assert (rows[0]["prompts_with_special_text"], rows[0]["replies_with_special_text"]) == (2, 5)
    built = data_report(rows)
    assert built["total"]["prompts_with_special_text"] == 3
    assert built["total"]["replies_with_special_text"] == 5
    table = [line for line in report.markdown(built).splitlines() if line.startswith("|")]
    cells = {row[0]: row for row in ([c.strip() for c in line.strip("|").split("|")] for line in table[2:])}
    column = {key: i for i, (key, _) in enumerate(report.COLUMNS)}
    assert cells["chat"][column["replies_with_special_text"]] == "5"
    assert cells["code"][column["prompts_with_special_text"]] == "1"
    assert cells["total"][column["prompts_with_special_text"]] == "3"
    assert cells["total"][column["replies_with_special_text"]] == "5"
