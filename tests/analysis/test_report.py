"""The HTML report and its SVG charts: what the charts count, and that they stay legible."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from records_support import episode_record

from budgetproxy.analysis import load, report, svg
from budgetproxy.analysis.progress import Progress
from budgetproxy.analysis.table import Budget, compute_cells, format_cells


def episode(eid: str, task: str = "t1", **fields: Any) -> dict[str, Any]:
    return episode_record(eid, **{"task_id": task, "turns_used": 3, **fields})


def loaded(con: Any, path: Path, records: list[dict[str, Any]]) -> Any:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    load.load_episodes(con, load.discover([str(path)]), Progress(0))
    return con


@pytest.fixture
def con() -> Iterator[Any]:
    with load.connect() as c:
        yield c


def tips(html: str) -> list[str]:
    return re.findall(r"<title>([^<]*)</title>", html)


# --- what the charts count ------------------------------------------------------------------


def test_exhaustion_counts_the_end_reason_not_the_flag(tmp_path: Path, con: Any) -> None:
    won_on_last_turn: dict[str, Any] = {
        "outcome": "success", "end_reason": "success", "success_turn": 5, "turns_used": 5,
        "exhausted": True,
    }  # fmt: skip
    loaded(con, tmp_path / "log.jsonl", [
        episode("a", **won_on_last_turn),
        episode("b", turns_used=5, exhausted=True, end_reason="exhausted"),
        episode("c"),
        episode("d", turns_used=5, exhausted=True, end_reason="abandoned", outcome=None),
    ])  # fmt: skip
    rates = report.tier_rates(con, ["disclosure"])
    third = (1 / 3, 1 / 3)  # one task: nothing to resample
    assert rates == {("hidden", 50): report.TierRates(finished=3, succeeded=1, exhausted=1,
                                                      tasks=1, success_ci=third,
                                                      exhausted_ci=third)}  # fmt: skip
    success, exhaustion = report.tier_charts(con, ["disclosure"], {})
    one = "50%, hidden: 33.3% (1 of 3 episodes, n = 1 task, no interval)"
    assert tips(success) == [one] and tips(exhaustion) == [one]
    assert "end reason is <i>exhausted</i>" in exhaustion  # the chart says what it counts
    # success, exhausted and failure shares are disjoint and add up
    (r,) = rates.values()
    assert r.succeeded + r.exhausted <= r.finished


def test_turns_used_is_a_histogram_of_the_episodes_own_budget(tmp_path: Path, con: Any) -> None:
    loaded(con, tmp_path / "log.jsonl", [
        episode("a", budget=10, turns_used=3),  # 30%: the 20–30 bin (upper end included)
        episode("b", budget=4, turns_used=1),  # 25%
        episode("c", budget=10, turns_used=10, end_reason="exhausted", exhausted=True),
        episode("d", budget=10, turns_used=9),  # 90%
    ])  # fmt: skip
    chart = report.turns_chart(con, ["disclosure"], {})
    assert "<rect" in chart and "<polyline" not in chart
    found = tips(chart)
    assert "20–30, hidden: 50.0% (2 of 4)" in found
    assert "80–90, hidden: 25.0% (1 of 4)" in found
    assert "all, hidden: 25.0% (1 of 4)" in found
    assert "90–100, hidden: 0.0% (0 of 4)" in found
    assert not any(t.startswith("0, ") for t in found)  # no empty "no turn" bin


def test_empty_pass_charts_say_why_and_legends_skip_empty_series(tmp_path: Path, con: Any) -> None:
    loaded(con, tmp_path / "log.jsonl", [
        episode("a", task="t1", disclosure="disclosed"),
        episode("b", task="t1"), episode("c", task="t1"), episode("d", task="t2"),
    ])  # fmt: skip
    budgets = [Budget("tier", Fraction(p)) for p in (25, 50)]
    cells = compute_cells(con, [1, 2, 4], budgets, ["disclosure"], resamples=50)
    charts = report.pass_curves(cells, report.slice_colors(cells, con, ["disclosure"]))
    k1, k2, k4 = charts
    assert ">disclosed</text>" in k1 and ">hidden</text>" in k1
    assert ">disclosed</text>" not in k2 and ">hidden</text>" in k2  # no task has 2 disclosed
    assert "Not drawn" in k2 and "disclosed" in k2.split("Not drawn")[1]
    assert "no data (fewer than 4 eligible episodes per task)" in k4
    assert "<polyline" not in k4 and "<figcaption>" not in k4


def test_one_colour_per_slice_across_the_page(tmp_path: Path, con: Any) -> None:
    loaded(con, tmp_path / "log.jsonl", [
        episode("a", disclosure="disclosed", budget=2), episode("b", budget=5),
    ])  # fmt: skip
    cells = compute_cells(con, [1], [Budget("tier", Fraction(50))], ["disclosure"], resamples=50)
    colors = report.slice_colors(cells, con, ["disclosure"])
    assert colors == {"disclosed": svg.PALETTE[0], "hidden": svg.PALETTE[1]}
    # the 20% tier has only the disclosed slice, the 50% one only hidden: colours still hold
    charts = "".join(report.tier_charts(con, ["disclosure"], colors))
    # (one task each: the bars are hatched, outlined in the slice's colour)
    assert re.search(rf'stroke="{svg.PALETTE[1]}" [^>]*><title>50%, hidden', charts)
    assert re.search(rf'stroke="{svg.PALETTE[0]}" [^>]*><title>20%, disclosed', charts)


def test_table_legend_explains_dashes_and_left_out_tasks(tmp_path: Path, con: Any) -> None:
    loaded(con, tmp_path / "log.jsonl", [
        episode("a1", task="a"), episode("a2", task="a"), episode("b1", task="b"),
    ])  # fmt: skip
    cells = compute_cells(con, [1, 2, 4], [Budget("tier", Fraction(50))], resamples=50)
    text = format_cells(cells, resamples=50, seed=0)
    row = next(line for line in text.splitlines() if line.startswith("50%"))
    assert row.split()[:3] == ["50%", "2", "3"] and row.endswith("—")
    assert "(1)" in row  # K=2: one of the two tasks
    assert "(n): n of the row's tasks have at least k eligible episodes" in text
    assert "—: none of the row's tasks has k eligible episodes at T" in text
    html = report.pass_table(cells)
    assert "<th>tasks</th><th>episodes</th>" in html and "—: none of the row" in html


# --- chart geometry -------------------------------------------------------------------------


@given(st.floats(min_value=1e-6, max_value=1e9))
def test_nice_ticks_are_clean_and_cover_the_data(top: float) -> None:
    ticks = svg.nice_ticks(top)
    assert ticks[0] == 0 and ticks[-1] >= top * (1 - 1e-9) and 2 <= len(ticks) <= 6
    step = ticks[1]
    mantissa = step / 10 ** math.floor(math.log10(step) + 1e-9)
    assert min(abs(mantissa - m) for m in (1, 2, 5)) < 1e-6
    assert ticks[-2] < top  # no spare step above the data


def test_tick_labels_are_round_numbers() -> None:
    chart = svg.line_chart("t", ["a", "b"], [svg.Series("s", [0.1, 0.4375])], x_title="x",
                           y_title="share")  # fmt: skip
    labels = re.findall(r'text-anchor="end">([^<]+)</text>', chart)
    assert labels == ["0%", "10%", "20%", "30%", "40%", "50%"]


@pytest.mark.parametrize("top", [0.4375, 1.0, 37.0, 123456.0])
def test_y_title_clears_the_widest_tick_label(top: float) -> None:
    percent = top <= 1
    chart = svg.line_chart("t", ["a", "b"], [svg.Series("s", [0.0, top])], x_title="x",
                           y_title="a long y axis title", percent=percent)  # fmt: skip
    ends = re.findall(r'<text x="([\d.]+)" y="[\d.]+" text-anchor="end">([^<]+)</text>', chart)
    starts = [float(x) - svg.text_width(label) for x, label in ends]
    title_x = float(re.findall(r"translate\(([\d.]+) [\d.]+\) rotate\(-90\)", chart)[0])
    assert min(starts) >= title_x + 6  # the rotated title's glyphs end at its x


def test_crowded_x_labels_turn_or_thin_out() -> None:
    def chart(n: int) -> str:
        labels = [f"{5 * (i + 1)}%" for i in range(n)]
        series = [svg.Series(name, [0.5] * n) for name in ("a", "b", "c")]
        return svg.bar_chart("t", labels, series, x_title="x", y_title="y")

    few, crowded, many = chart(6), chart(20), chart(120)
    assert "rotate(-45)" not in few
    assert crowded.count("rotate(-45)") == 20  # every label, turned
    flat = re.findall(r'text-anchor="middle">(\d+%)</text>', many)
    assert "rotate(-45)" not in many and 5 < len(flat) < 60  # a readable subset, flat


def test_confidence_bands_only_for_few_series() -> None:
    def chart(n: int) -> str:
        series = [svg.Series(f"s{i}", [0.2, 0.5], [0.1, 0.4], [0.3, 0.6]) for i in range(n)]
        return svg.line_chart("t", ["a", "b"], series, x_title="x", y_title="y", y_max=1.0)

    assert chart(2).count("<polygon") == 2 and svg.ci_mark([]) == "shaded bands"
    three = chart(3)
    assert "<polygon" not in three and three.count('stroke-opacity="0.55"') == 6
    assert "[10.0%, 30.0%]" in three  # hover text carries the interval


def test_a_series_without_data_has_no_legend_entry() -> None:
    chart = svg.bar_chart("t", ["a"], [svg.Series("shown", [0.0]), svg.Series("gone", [None])],
                          x_title="x", y_title="y")  # fmt: skip
    assert ">shown</text>" in chart and "gone" not in chart
    assert re.search(r'height="1.5"', chart)  # a zero is drawn, unlike a missing value
    empty = svg.bar_chart("t", ["a"], [svg.Series("gone", [None])], x_title="x", y_title="y",
                          empty="nothing here")  # fmt: skip
    assert "nothing here" in empty and "gone" not in empty


def test_bars_carry_intervals_over_tasks_and_counts(tmp_path: Path, con: Any) -> None:
    won: dict[str, Any] = {"outcome": "success", "end_reason": "success", "success_turn": 2}
    records = [episode(f"e{t}-{i}", task=f"t{t}", **(won if i < t % 4 else {}))
               for t in range(12) for i in range(4)]  # fmt: skip
    loaded(con, tmp_path / "log.jsonl", records)
    (rates,) = report.tier_rates(con, ["disclosure"]).values()
    assert (rates.finished, rates.tasks) == (48, 12)
    assert rates.success_ci is not None
    low, high = rates.success_ci
    assert low < rates.succeeded / rates.finished < high  # tasks differ: the interval has width
    success, _ = report.tier_charts(con, ["disclosure"], {})
    assert success.count("<path d=") == 1  # the whisker
    assert ">48</text>" in success  # the count over the bar
    assert "12 tasks per bar" in success


def test_bars_on_one_task_are_hatched_and_have_no_whisker(tmp_path: Path, con: Any) -> None:
    won: dict[str, Any] = {"outcome": "success", "end_reason": "success", "success_turn": 2}
    loaded(con, tmp_path / "log.jsonl", [
        *(episode(f"a{i}", task="t1", budget=5, max_turns=20, **(won if i else {}))
          for i in range(4)),  # 25%: one task
        *(episode(f"b{t}{i}", task=f"t{t}", budget=10, max_turns=20, **(won if i < t else {}))
          for t in range(1, 4) for i in range(4)),  # 50%: three tasks
    ])  # fmt: skip
    success, _ = report.tier_charts(con, ["disclosure"], {"hidden": "#0072B2"})
    bars = re.findall(r"<rect x=\S+ y=\S+ width=\S+ height=\S+ ([^>]*)><title>([^<]*)", success)
    assert [(paint, tip.split(" (")[0]) for paint, tip in bars] == [
        ('fill="url(#hatch-0072B2)" stroke="#0072B2" stroke-width="1"', "25%, hidden: 75.0%"),
        ('fill="#0072B2"', tips(success)[1].split(" (")[0]),
    ]
    assert "n = 1 task, no interval" in bars[0][1] and "3 tasks" in bars[1][1]
    assert success.count("<path d=") == 1  # the three-task bar's whisker only
    assert success.count('<pattern id="hatch-0072B2"') == 1
    assert "Hatched bars rest on one task (n = 1 task, no interval)" in success


def test_difference_charts_of_one_comparison_share_one_x_scale() -> None:
    from budgetproxy.analysis.compare import Difference, parse_comparison
    from budgetproxy.analysis.compare_chart import difference_charts

    c = parse_comparison("disclosure=disclosed,hidden")
    budget = Budget("tier", Fraction(25))

    def diff(k: int, value: float, low: float, high: float, label: str = "x") -> Difference:
        return Difference(comparison=c, k=k, budget=budget, by=(("policy", label),), diff=value,
                          ci_low=low, ci_high=high, a_value=0.5, b_value=0.5, n_tasks=12,
                          n_tasks_unpaired=0)  # fmt: skip

    charts = difference_charts([[diff(1, 0.4, 0.2, 0.6), diff(8, 0.02, -0.01, 0.05,
                                                              "a much longer slice name")]])
    assert len(charts) == 2

    def axis(chart: str) -> dict[str, str]:  # tick label → its x
        return {label: x for x, label in re.findall(
            r'<text x="([\d.]+)" y="\d+" text-anchor="middle">([+-]\d+)</text>', chart)}

    first, second = axis(charts[0]), axis(charts[1])
    assert first == second and set(first) == {"-100", "-50", "+0", "+50", "+100"}
    assert "has the same x scale" in charts[0]


def test_report_has_paired_difference_charts_and_task_counts(tmp_path: Path, con: Any) -> None:
    from budgetproxy.analysis.compare import compute_differences, parse_comparison

    won: dict[str, Any] = {"outcome": "success", "end_reason": "success", "success_turn": 2}
    records = [
        episode(f"{arm}{t}-{i}", task=f"t{t}", disclosure=arm, budget=5, max_turns=5,
                **(won if i < (t % 3) + (arm == "disclosed") else {}))
        for t in range(12) for arm in ("hidden", "disclosed") for i in range(4)
    ]  # fmt: skip
    loaded(con, tmp_path / "log.jsonl", records)
    budgets = [Budget("tier", Fraction(100))]
    cells = compute_cells(con, [1], budgets, ["disclosure"], 200, 0)
    diffs = compute_differences(con, parse_comparison("disclosure=disclosed,hidden"), [1],
                                budgets, ["disclosure"], 200, 0)  # fmt: skip
    page = report.render_report(con, cells, ["disclosure"], {}, (), [diffs], 200, 0)
    assert "<h2>Paired differences</h2>" in page
    assert "Pass@(1,T): disclosed − hidden" in page
    assert "+25.0 [zero width: all tasks equal]" not in page  # the note is words, not a range
    assert "12 tasks, zero width: all tasks equal" in page
    assert "Tasks per point: 12" in page


def test_tier_axis_says_turns_when_every_task_shares_max_turns(tmp_path: Path, con: Any) -> None:
    loaded(con, tmp_path / "log.jsonl", [episode("a", budget=10, max_turns=10)])
    cells = compute_cells(con, [1], [Budget("tier", Fraction(p)) for p in (25, 100)], [], 50, 0)
    page = report.render_report(con, cells, ["disclosure"], {})
    assert "25% (3)" in page and "100% (10)" in page and "max_turns = 10" in page


def test_piled_cells_are_marked_in_the_report(tmp_path: Path, con: Any) -> None:
    won: dict[str, Any] = {"outcome": "success", "end_reason": "success", "success_turn": 2}
    # 9 tasks won in 4 of 5 episodes (Pass@2 exactly 1), 3 in 1 of 5 (0.4): piled at K=2
    records = [
        episode(f"e{t}-{j}", task=f"t{t:02d}", budget=5, max_turns=5,
                **(won if j < (4 if t < 9 else 1) else {}))
        for t in range(12) for j in range(5)
    ]  # fmt: skip
    loaded(con, tmp_path / "log.jsonl", records)
    cells = compute_cells(con, [1, 2], [Budget("tier", Fraction(100))], [], 200, 0)
    assert [c.piled for c in cells] == [False, True]
    html = report.pass_table(cells)
    assert html.count("‡") == 2  # the K=2 cell, and its note in the legend
    row = re.search(r"<tr><td>all</td><td>100%</td>.*?</tr>", html)
    assert row is not None
    k1, k2 = re.findall(r"<td>[\d.]+ <span class=muted>[^<]*</span></td>", row.group(0))
    assert "‡" in k2 and "‡" not in k1
    assert "<li>‡: at least 3/4 of the tasks&#x27; estimates at exactly 1" in html
    page = report.render_report(con, cells, ["disclosure"], {}, resamples=200, seed=0)
    assert "Points marked ‡ in the table have at least 3/4 of the tasks" in page
    # no piled cell, no mark and no note
    plain = report.pass_table([cells[0]])
    assert "‡" not in plain
