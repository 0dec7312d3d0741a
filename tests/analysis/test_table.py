"""Pass@(K,T) over crafted logs: eligibility rules, tiers per task, left-out tasks, slices.

The DuckDB pipeline is also checked against a plain-Python reference built on `passk`.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from records_support import episode_record

from budgetproxy.analysis import load
from budgetproxy.analysis.passk import is_eligible, pass_at_k, succeeded_within, tier_to_turns
from budgetproxy.analysis.progress import Progress
from budgetproxy.analysis.table import Budget, Cell, compute_cells, format_cells

TIER = "tier"
TURNS = "turns"


def episode(eid: str, task: str | None = "t1", **fields: Any) -> dict[str, Any]:
    return episode_record(eid, **{"task_id": task, "budget": 10, "tier": "100%",
                                  "turns_used": 10, **fields})


def win(eid: str, turn: int, task: str | None = "t1", **fields: Any) -> dict[str, Any]:
    won: dict[str, Any] = {
        "outcome": "success", "end_reason": "success", "success_turn": turn, "turns_used": turn,
    }  # fmt: skip
    return episode(eid, task, **{**won, **fields})


def write(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.fixture
def con() -> Iterator[Any]:
    with load.connect() as c:
        yield c


def cells_for(
    con: Any, path: Path, ks: list[int], budgets: list[Budget], by: list[str] | None = None
) -> list[Cell]:
    load.load_episodes(con, load.discover([str(path)]), Progress(0))
    return compute_cells(con, ks, budgets, by or [], resamples=200, seed=0)


def one(cells: list[Cell], **match: Any) -> Cell:
    found = [c for c in cells if all(_attr(c, k) == v for k, v in match.items())]
    assert len(found) == 1, found
    return found[0]


def _attr(cell: Cell, key: str) -> Any:
    if key == "label":
        return cell.budget.label
    if key == "by":
        return dict(cell.by)
    return getattr(cell, key)


def test_hidden_episodes_count_at_every_t_up_to_their_budget(tmp_path: Path, con: Any) -> None:
    log = write(tmp_path / "log.jsonl", [
        win("a", 3, budget=10), win("b", 7, budget=10), episode("c", budget=10),
        episode("d", budget=4, turns_used=4, end_reason="exhausted", exhausted=True),
    ])  # fmt: skip
    cells = cells_for(con, log, [1], [Budget(TURNS, Fraction(t)) for t in (3, 4, 8, 10, 11)])
    at = {c.budget.label: c for c in cells}
    assert (at["3"].n_episodes, at["3"].value) == (4, 0.25)  # a succeeded by turn 3
    assert (at["4"].n_episodes, at["4"].value) == (4, 0.25)  # d (budget 4) still eligible
    assert (at["8"].n_episodes, at["8"].value) == (3, pytest.approx(2 / 3))  # d is not
    assert (at["10"].n_episodes, at["10"].value) == (3, pytest.approx(2 / 3))
    assert at["11"].value is None and at["11"].n_tasks_left_out == 1


def test_disclosed_episodes_count_only_at_their_own_budget(tmp_path: Path, con: Any) -> None:
    log = write(tmp_path / "log.jsonl", [
        win("a", 2, budget=4, disclosure="disclosed"),
        episode("b", budget=4, disclosure="disclosed", turns_used=4),
        win("c", 2, budget=8, disclosure="disclosed"),
        win("d", 2, budget=4, disclosure="disclosed", announced_budget=6),  # told 6: out
        win("e", 2, budget=4, disclosure="disclosed", announced_budget=4),  # told 4: in
    ])  # fmt: skip
    cells = cells_for(con, log, [1], [Budget(TURNS, Fraction(t)) for t in (2, 4, 8)])
    at = {c.budget.label: c for c in cells}
    assert at["2"].value is None  # nobody was disclosed a budget of 2
    assert (at["4"].n_episodes, at["4"].value) == (3, pytest.approx(2 / 3))
    assert (at["8"].n_episodes, at["8"].value) == (1, 1.0)


def test_abandoned_and_taskless_episodes_are_left_out(tmp_path: Path, con: Any) -> None:
    log = write(tmp_path / "log.jsonl", [
        win("a", 2), episode("b"),
        win("c", 2, end_reason="abandoned", outcome=None),
        episode("d", end_reason="abandoned", outcome=None),
        win("e", 2, task=None),
        win("f", 2, task=None),
    ])  # fmt: skip
    cells = cells_for(con, log, [1], [Budget(TIER, Fraction(100))])
    assert (cells[0].n_episodes, cells[0].value) == (2, 0.5)


def test_tiers_resolve_per_task_with_round_half_up(tmp_path: Path, con: Any) -> None:
    # task s: max_turns 10, 25% → 3 (2.5 up); task u: max_turns 6, 25% → 2 (1.5 up)
    log = write(tmp_path / "log.jsonl", [
        win("s1", 3, task="s", budget=3, max_turns=10, disclosure="disclosed"),
        episode("s2", task="s", budget=2, max_turns=10, disclosure="disclosed"),
        win("u1", 2, task="u", budget=2, max_turns=6, disclosure="disclosed"),
        win("u2", 3, task="u", budget=6, max_turns=6),  # hidden, but too late for T=2
    ])  # fmt: skip
    cells = cells_for(con, log, [1], [Budget(TIER, Fraction(25))], by=["task_id"])
    s = one(cells, by={"task_id": "s"})
    u = one(cells, by={"task_id": "u"})
    assert (s.n_episodes, s.value) == (1, 1.0)
    assert (u.n_episodes, u.value) == (2, 0.5)


def test_tasks_with_fewer_than_k_episodes_are_left_out_and_counted(
    tmp_path: Path, con: Any
) -> None:
    log = write(tmp_path / "log.jsonl", [
        win("a1", 1, task="a"), episode("a2", task="a"), episode("a3", task="a"),
        win("b1", 1, task="b"),
    ])  # fmt: skip
    cells = cells_for(con, log, [1, 2], [Budget(TIER, Fraction(100))])
    k1, k2 = one(cells, k=1), one(cells, k=2)
    assert (k1.n_tasks, k1.n_tasks_left_out, k1.value) == (2, 0, pytest.approx((1 / 3 + 1) / 2))
    assert (k2.n_tasks, k2.n_tasks_left_out, k2.n_episodes) == (1, 1, 3)
    assert k2.value == pytest.approx(pass_at_k(3, 1, 2))
    assert k2.as_json() == {
        "k": 2, "tier": "100%", "value": k2.value, "ci_low": k2.ci_low, "ci_high": k2.ci_high,
        "n_tasks": 1, "n_tasks_left_out": 1, "n_episodes": 3, "by": {},
        "ci_note": "zero width: one task", "few_tasks": True, "piled": False,
    }  # fmt: skip
    text = format_cells(cells, resamples=200, seed=0)
    assert "K=1" in text and "K=2" in text and "(1)" in text


def test_success_turn_defaults_to_turns_used(tmp_path: Path, con: Any) -> None:
    log = write(tmp_path / "log.jsonl", [
        episode("a", outcome="success", end_reason="success", success_turn=None, turns_used=3),
    ])  # fmt: skip
    cells = cells_for(con, log, [1], [Budget(TURNS, Fraction(2)), Budget(TURNS, Fraction(3))])
    assert [c.value for c in cells] == [0.0, 1.0]


def test_by_tag_and_by_two_fields(tmp_path: Path, con: Any) -> None:
    log = write(tmp_path / "log.jsonl", [
        win("a", 1, tags={"policy": "rl"}, model="x"),
        episode("b", tags={"policy": "base"}, model="x"),
        episode("c", model="y"),
    ])  # fmt: skip
    cells = cells_for(con, log, [1], [Budget(TIER, Fraction(100))], by=["policy", "model"])
    assert [(dict(c.by), c.value) for c in cells] == [
        ({"policy": "base", "model": "x"}, 0.0),
        ({"policy": "rl", "model": "x"}, 1.0),
        ({"policy": None, "model": "y"}, 0.0),
    ]


def test_duplicate_episode_records_keep_the_last_line(tmp_path: Path, con: Any) -> None:
    # The last record wins by position, not by ended_at: a later line of the same file.
    log = write(tmp_path / "log.jsonl", [
        episode("a", ended_at="2026-11-30T10:05:00.000Z"),
        episode("a", ended_at="2026-11-30T10:09:00.000Z"),
        win("a", 2, ended_at="2026-11-30T10:07:00.000Z"),
        win("b", 2), win("b", 2),
    ])  # fmt: skip
    summary = load.load_episodes(con, load.discover([str(log)]), Progress(0))
    assert (summary.episode_records, summary.episodes, summary.duplicates) == (5, 2, 3)
    cells = compute_cells(con, [1], [Budget(TIER, Fraction(100))], ["task_id"], 100, 0)
    assert cells[0].value == 1.0


def test_the_last_record_wins_on_ties_file_order_then_line_order(tmp_path: Path) -> None:
    # 200 failure-then-success pairs with equal ended_at: every episode ends a success.
    pairs = [r for i in range(200) for r in (episode(f"e{i}", task=f"t{i % 20}"),
                                             win(f"e{i}", 3, task=f"t{i % 20}"))]  # fmt: skip
    log = write(tmp_path / "pairs.jsonl", pairs)
    for _ in range(3):
        with load.connect() as con:
            cells = cells_for(con, log, [1], [Budget(TIER, Fraction(100))])
        assert (cells[0].value, cells[0].n_episodes) == (1.0, 200)
    # Across files the later file wins, whatever the lines say: b.jsonl after a.jsonl.
    (tmp_path / "two").mkdir()
    write(tmp_path / "two" / "a.jsonl", [win(f"e{i}", 3) for i in range(50)])
    write(tmp_path / "two" / "b.jsonl", [episode(f"e{i}", ended_at="2026-11-30T09:00:00.000Z")
                                         for i in range(50)])  # fmt: skip
    with load.connect() as con:
        cells = cells_for(con, tmp_path / "two", [1], [Budget(TIER, Fraction(100))])
    assert (cells[0].value, cells[0].n_episodes) == (0.0, 50)
    # Files named on the command line keep the order given.
    with load.connect() as con:
        load.load_episodes(con, load.discover([str(tmp_path / "two" / "b.jsonl"),
                                               str(tmp_path / "two" / "a.jsonl")]), Progress(0))
        assert compute_cells(con, [1], [Budget(TIER, Fraction(100))])[0].value == 1.0


# --- the pipeline against a plain-Python reference -------------------------------------------

episodes_strategy = st.lists(
    st.fixed_dictionaries({
        "task": st.sampled_from(["t1", "t2", "t3", None]),
        "arm": st.sampled_from(["hidden", "disclosed"]),
        "max_turns": st.sampled_from([4, 6, 10]),
        "budget_pct": st.integers(1, 10),
        "announced": st.sampled_from([None, None, "same", "other"]),
        "success_turn": st.one_of(st.none(), st.integers(1, 10)),
        "abandoned": st.booleans(),
    }),
    min_size=0, max_size=30,
)  # fmt: skip


def build(specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    records = []
    for i, s in enumerate(specs):
        budget = max(1, s["max_turns"] * s["budget_pct"] // 10)
        announced = {None: None, "same": budget, "other": budget + 1}[s["announced"]]
        turn = s["success_turn"]
        ok = turn is not None and turn <= budget and not s["abandoned"]
        records.append(episode(
            f"e{i}", s["task"], budget=budget, max_turns=s["max_turns"], disclosure=s["arm"],
            announced_budget=announced, turns_used=turn if ok else budget,
            outcome="success" if ok else None, success_turn=turn if ok else None,
            end_reason="success" if ok else ("abandoned" if s["abandoned"] else "exhausted"),
        ))  # fmt: skip
    return records


def reference(
    records: list[dict[str, Any]], ks: list[int], budgets: list[Budget]
) -> dict[tuple[str, str, int], tuple[float | None, int, int, int]]:
    out = {}
    for arm in ("hidden", "disclosed"):
        mine = [r for r in records if r["disclosure"] == arm and r["task_id"] is not None
                and r["end_reason"] != "abandoned"]  # fmt: skip
        if not mine:
            continue
        for b in budgets:
            tasks: dict[str, list[int]] = defaultdict(lambda: [0, 0])
            for r in mine:
                t = tier_to_turns(b.value, r["max_turns"]) if b.kind == TIER else int(b.value)
                counts = tasks[r["task_id"]]
                if is_eligible(arm, r["budget"], r["announced_budget"], t):
                    counts[0] += 1
                    counts[1] += succeeded_within(
                        r["outcome"] == "success", r["success_turn"], t)  # fmt: skip
            for k in ks:
                used = [(n, c) for n, c in tasks.values() if n >= k]
                value = sum(pass_at_k(n, c, k) for n, c in used) / len(used) if used else None
                out[(arm, b.label, k)] = (
                    value,
                    len(used),
                    len(tasks) - len(used),
                    sum(n for n, _ in used),
                )
    return out


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(specs=episodes_strategy)
def test_pipeline_matches_reference(tmp_path: Path, specs: list[dict[str, Any]]) -> None:
    records = build(specs)
    path = write(tmp_path / "ref.jsonl", records)
    ks = [1, 2, 3]
    budgets = [Budget(TIER, Fraction(p)) for p in (25, 50, 100)]
    budgets += [Budget(TURNS, Fraction(t)) for t in (1, 3, 6)]
    expected = reference(records, ks, budgets)
    with load.connect() as con:
        cells = cells_for(con, path, ks, budgets, by=["disclosure"])
    got = {
        (dict(c.by)["disclosure"], c.budget.label, c.k):
            (c.value, c.n_tasks, c.n_tasks_left_out, c.n_episodes)
        for c in cells
    }  # fmt: skip
    assert got.keys() == expected.keys()
    for key, (value, n_tasks, left_out, n_eps) in expected.items():
        g = got[key]
        assert g[1:] == (n_tasks, left_out, n_eps), key
        assert (g[0] is None) == (value is None), key
        if value is not None:
            assert g[0] == pytest.approx(value, abs=1e-12), key


def _many_tasks(tasks: int = 40, per_task: int = 6, seed: int = 1) -> list[dict[str, Any]]:
    import random

    rnd = random.Random(seed)
    records = []
    for t in range(tasks):
        for i in range(per_task):
            if rnd.random() < 0.5:
                records.append(win(f"e{t}-{i}", rnd.randint(1, 10), task=f"task-{t}"))
            else:
                records.append(episode(f"e{t}-{i}", task=f"task-{t}"))
    return records


def test_intervals_do_not_depend_on_the_order_of_the_log(tmp_path: Path) -> None:
    # The bootstrap resamples tasks by position: tasks must come in a fixed order (task_id),
    # not in whatever order DuckDB grouped them, or the same seed gives other intervals.
    import random

    records = _many_tasks()
    budgets = [Budget(TIER, Fraction(p)) for p in (30, 100)]
    seen = set()
    for shuffle in range(4):
        random.Random(shuffle).shuffle(records)
        log = write(tmp_path / f"log{shuffle}.jsonl", records)
        with load.connect() as con:
            cells = cells_for(con, log, [1, 2], budgets)
        seen.add(tuple((c.value, c.ci_low, c.ci_high) for c in cells))
    assert len(seen) == 1, seen


def test_zero_width_intervals_say_why(tmp_path: Path) -> None:
    def cells(name: str, records: list[dict[str, Any]], by: list[str] | None = None) -> list[Cell]:
        with load.connect() as con:
            return cells_for(con, write(tmp_path / name, records), [1, 2],
                             [Budget(TIER, Fraction(100))], by)  # fmt: skip

    half = [win("b1", 2, task="b"), episode("b2", task="b"),
            win("c1", 2, task="c"), episode("c2", task="c")]  # fmt: skip
    split = cells("split.jsonl", [win("a1", 2, task="a"), *half], by=["task_id"])
    assert one(split, by={"task_id": "a"}, k=1).ci_note == "zero width: one task"
    pooled = cells("pooled.jsonl", half)  # two tasks, both at 1/2 for K=1 and 1 for K=2
    assert one(pooled, k=1).ci_note == "zero width: all tasks equal"
    assert one(pooled, k=2).ci_note == "zero width: all tasks at 1"
    spread = one(cells("spread.jsonl", [*half[:2], episode("c1", task="c")]), k=1)
    assert spread.ci_note is None and spread.ci_low is not None and spread.ci_high is not None
    assert spread.ci_low < spread.ci_high
    text = format_cells(split, 200, 0)
    assert "[zero width: one task]" in text and "†" in text


def _tasks(easy: int, hard: int) -> list[dict[str, Any]]:
    """`easy` tasks won in 4 of 5 episodes (Pass@2 exactly 1), `hard` ones in 1 of 5 (0.4)."""
    records = []
    for i in range(easy + hard):
        wins = 4 if i < easy else 1
        records += [win(f"e{i}-{j}", 2, task=f"t{i:02d}") if j < wins
                    else episode(f"e{i}-{j}", task=f"t{i:02d}") for j in range(5)]
    return records


def test_cells_with_most_tasks_at_one_bound_are_flagged_piled(tmp_path: Path) -> None:
    budgets = [Budget(TIER, Fraction(100))]
    with load.connect() as con:
        cells = cells_for(con, write(tmp_path / "piled.jsonl", _tasks(9, 3)), [1, 2], budgets)
    at_two = one(cells, k=2)
    # 9 of 12 tasks at exactly 1: the interval misses low-side uncertainty, and says so
    assert at_two.value == pytest.approx((9 + 3 * 0.4) / 12)
    assert at_two.piled and not at_two.few_tasks and at_two.ci_note is None
    assert at_two.as_json()["piled"] is True
    # at K=1 the same tasks sit at 0.8 and 0.2: no pile
    assert not one(cells, k=1).piled and one(cells, k=1).as_json()["piled"] is False
    text = format_cells(cells, 200, 0)
    row = next(line for line in text.splitlines() if line.startswith("100%"))
    assert row.endswith("‡") and row.count("‡") == 1
    assert "‡: at least 3/4 of the tasks' estimates at exactly 1 (or at exactly 0)" in text
    with load.connect() as con:
        cells = cells_for(con, write(tmp_path / "spread.jsonl", _tasks(8, 4)), [2], budgets)
    assert not one(cells, k=2).piled  # 8 of 12 at 1: under 3/4
    assert "‡" not in format_cells(cells, 200, 0)


def test_piled_counts_either_bound_but_not_both_together() -> None:
    from budgetproxy.analysis.stats import piled

    assert piled([1.0] * 3 + [0.5])
    assert piled([0.0] * 3 + [0.4])
    assert not piled([1.0] * 2 + [0.0] * 2)  # half at each bound: the spread is seen
    assert not piled([1.0] * 2 + [0.5])
    assert not piled([])
