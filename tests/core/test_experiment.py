"""Live experiments as values: arm draws, what an arm changes, and the view from outcomes."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from budgetproxy.config import ExperimentConfig
from budgetproxy.core.experiment import (
    Finished,
    apply_arm,
    block_arm,
    draw_arm,
    experiment_from_record,
    experiment_view,
    first_stops,
    kept_unit,
    outcome_of,
    settings_record,
    stopped_arm,
    stratum,
)
from budgetproxy.core.spec import EpisodeSpec


def exp(**changes: Any) -> ExperimentConfig:
    base: dict[str, Any] = {
        "name": "e", "unit": "episode",
        "arms": [{"name": "a", "disclosure": "hidden"},
                 {"name": "b", "disclosure": "disclosed", "announced_budget": 9, "budget": 4}]}
    return ExperimentConfig.model_validate({**base, **changes})


def finished(i: int, arm: str, success: bool | None, task: str | None = "t") -> Finished:
    return Finished(f"ep{i:04d}", task, arm, success, f"2026-12-06T10:00:{i // 1000:02d}."
                    f"{i % 1000:03d}Z")


def test_draws_are_uniform_and_fixed_by_seed_experiment_and_unit() -> None:
    e = exp(arms=[{"name": n} for n in "abc"])
    draws = [draw_arm(0, e, EpisodeSpec(f"ep{i}")) for i in range(3000)]
    assert draws == [draw_arm(0, e, EpisodeSpec(f"ep{i}")) for i in range(3000)]
    counts = Counter(draws)
    assert set(counts) == {0, 1, 2} and all(900 < c < 1100 for c in counts.values())
    assert draws != [draw_arm(1, e, EpisodeSpec(f"ep{i}")) for i in range(3000)]


@pytest.mark.parametrize(("unit", "specs"), [
    ("task", [EpisodeSpec(f"ep{i}", task_id="t7", group=f"g{i}") for i in range(20)]),
    ("group", [EpisodeSpec(f"ep{i}", task_id="t7", group="g1") for i in range(20)]),
])
def test_a_unit_shares_one_arm(unit: str, specs: list[EpisodeSpec]) -> None:
    e = exp(unit=unit)
    assert len({draw_arm(0, e, s) for s in specs}) == 1


def test_an_arm_wins_over_the_episode_and_leaves_the_rest() -> None:
    e = exp()
    spec = EpisodeSpec("ep", budget=8, max_turns=16, disclosure="hidden", task_id="t")
    told = apply_arm(spec, e.arms[1])
    assert (told.disclosure, told.announced_budget, told.budget) == ("disclosed", 9, 4)
    assert (told.max_turns, told.task_id) == (16, "t")
    assert apply_arm(spec, e.arms[0]) == spec


def test_the_stopped_arm() -> None:
    assert stopped_arm(exp(), "stop_b_better") == 1
    assert stopped_arm(exp(), "stop_a_better") == 0
    assert stopped_arm(exp(), "stop_futile") == 0
    assert stopped_arm(exp(on_stop="control"), "stop_b_better") == 0


def test_outcomes() -> None:
    assert [outcome_of(r) for r in ("success", "failure", "exhausted", "abandoned", None)] == [
        True, False, False, None, None]


def test_the_view_counts_pairs_within_a_task_and_leaves_abandoned_out() -> None:
    done = [finished(1, "a", True, "t1"), finished(2, "b", False, "t2"),
            finished(3, "b", True, "t1"), finished(4, "a", None, "t2"),
            finished(5, "gone", True, "t1")]
    view = experiment_view(exp(), reversed(done))  # any order: sorted by (ended_at, id)
    assert view["arms"] == [
        {"name": "a", "episodes": 1, "successes": 1, "estimate": 1.0, "left_out": 1,
         "clipped": 0},
        {"name": "b", "episodes": 2, "successes": 1, "estimate": 0.5, "left_out": 0,
         "clipped": 0}]
    assert view["difference"]["pairs"] == 1 and view["difference"]["estimate"] == 0.0
    assert view["decision"] == "continue" and view["stopped"] is None
    # a unit of whole tasks pairs across tasks: a's success on t1 with b's failure on t2
    across = experiment_view(exp(unit="task"), done)["difference"]
    assert (across["pairs"], across["estimate"]) == (1, 1.0)


def test_a_clear_difference_stops_and_first_stops_finds_when() -> None:
    done = [finished(i, "ab"[i % 2], i % 2 == 0) for i in range(200)]
    view = experiment_view(exp(), done)
    assert view["decision"] == "stop_a_better"
    assert 0 < view["difference"]["cs_low"] <= 1
    n, comparison = first_stops(exp(), done)[("a", "b")]
    assert comparison["decision"] == "stop_a_better"
    assert experiment_view(exp(), done[:n - 1])["decision"] == "continue"


def test_three_arms_split_alpha_over_two_comparisons() -> None:
    e = exp(arms=[{"name": "a"}, {"name": "b"}, {"name": "c"}])
    done = [finished(i, "abc"[i % 3], i % 3 == 0) for i in range(300)]
    view = experiment_view(e, done)
    assert [(c["a"], c["b"]) for c in view["comparisons"]] == [("a", "b"), ("a", "c")]
    assert view["difference"] == view["comparisons"][0]["difference"]
    two = experiment_view(exp(arms=[{"name": "a"}, {"name": "b"}]),
                          [f for f in done if f.arm != "c"])
    assert two["difference"]["cs_low"] >= view["difference"]["cs_low"]  # wider at alpha / 2


def test_settings_round_trip() -> None:
    e = exp(min_effect=0.1, stop="auto")
    assert experiment_from_record({"type": "experiment", "ts": "x", **settings_record(e)}) == e


def test_permuted_blocks_give_each_arm_once_per_block() -> None:
    e = exp(arms=[{"name": n} for n in "abc"])
    for where in ("", "task-1"):
        arms = [block_arm(0, e, where, n) for n in range(30)]
        assert all(sorted(arms[i:i + 3]) == [0, 1, 2] for i in range(0, 30, 3))
        assert arms == [block_arm(0, e, where, n) for n in range(30)]
    assert [block_arm(0, e, "", n) for n in range(30)] != [
        block_arm(1, e, "", n) for n in range(30)]


def test_strata_and_kept_units() -> None:
    spec = EpisodeSpec("ep", task_id="t", group="g")
    assert (stratum(exp(unit="task"), spec), kept_unit(exp(unit="task"), spec)) == (
        "", "task\x1ft")
    assert (stratum(exp(unit="group"), spec), kept_unit(exp(unit="group"), spec)) == (
        "t", "group\x1ft\x1fg")
    assert (stratum(exp(), spec), kept_unit(exp(), spec)) == ("t", None)
    assert kept_unit(exp(unit="task"), EpisodeSpec("ep")) is None  # no task: its own unit
