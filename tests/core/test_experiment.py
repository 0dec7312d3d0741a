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
    finished_of,
    first_stops,
    kept_unit,
    metric_value,
    outcome_of,
    settings_record,
    stopped_arm,
    stratum,
)
from budgetproxy.core.sequential import DifferenceSequence
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


def _ep(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"episode_id": "ep1", "task_id": "t",
                            "ended_at": "2026-12-06T10:00:00.000Z",
                            "end_reason": "success", "outcome": "success", "reward": None,
                            "max_turns": 20, "success_turn": 5, "turns_used": 5,
                            "token_budget": 10_000, "tokens_used": 1234,
                            "cost_budget": 1.0, "cost_used": 0.0125}
    return {**base, **fields}


@pytest.mark.parametrize(("changes", "fields", "value"), [
    ({}, {}, 1.0),
    ({}, {"end_reason": "exhausted", "outcome": None}, 0.0),
    ({"metric": "pass_at_tier", "tier": 25}, {}, 1.0),  # T = 5
    ({"metric": "pass_at_tier", "tier": 25}, {"success_turn": 6, "turns_used": 6}, 0.0),
    ({"metric": "pass_at_tier", "tier": 25}, {"success_turn": None, "turns_used": 4}, 1.0),
    ({"metric": "pass_at_tier", "tier": 12.5}, {"max_turns": 20}, 0.0),  # T = round(2.5) = 3
    ({"metric": "pass_at_tier", "tier": 25}, {"end_reason": "failure", "success_turn": None},
     0.0),
    ({"metric": "pass_at_tier", "tier": 25}, {"max_turns": None}, None),
    ({"metric": "reward"}, {"reward": 0.25}, 0.25),
    ({"metric": "reward"}, {"reward": None}, 1.0),  # a success without a reward: 1
    ({"metric": "reward"}, {"reward": 7.0, "end_reason": "exhausted", "outcome": None}, 7.0),
    ({"metric": "tokens", "metric_max": 5000}, {}, 1234.0),
    ({"metric": "tokens", "metric_max": 5000}, {"token_budget": None}, None),
    ({"metric": "cost", "metric_max": 0.1}, {}, 0.0125),
    ({"metric": "cost", "metric_max": 0.1}, {"cost_budget": None}, None),
    ({"metric": "tokens", "metric_max": 5000}, {"end_reason": "abandoned"}, None),
])
def test_metric_values_from_the_episode_record(changes: dict[str, Any], fields: dict[str, Any],
                                               value: float | None) -> None:
    assert metric_value(exp(**changes), _ep(**fields), "keep") == value


def test_the_reward_rule_applies_before_the_metric() -> None:
    ep = _ep(reward=7.0, end_reason="exhausted", outcome=None)
    assert metric_value(exp(metric="reward"), ep, "zero") == 0.0
    left = finished_of(exp(metric="pass_at_tier", tier=25), "a", _ep(max_turns=None), "keep")
    assert left.success is None and left.outcome is None


def _spend(i: int, arm: str, tokens: float, task: str = "t") -> Finished:
    return Finished(f"ep{i:04d}", task, arm, True, f"2026-12-06T10:00:{i // 1000:02d}."
                    f"{i % 1000:03d}Z", tokens)


def test_a_bounded_metric_is_clipped_rescaled_and_reported_in_its_units() -> None:
    e = exp(metric="tokens", metric_max=4000)
    done = [_spend(2 * i + k, arm, tokens) for i in range(60)
            for k, (arm, tokens) in enumerate((("a", 1000.0), ("b", 3000.0 + 10 * (i % 3))))]
    done.append(_spend(500, "b", 9000.0, task="u"))  # above the range: counts as 4000
    view = experiment_view(e, done)
    a, b = view["arms"]
    assert (a["estimate"], a["clipped"]) == (1000.0, 0)
    assert b["clipped"] == 1 and b["estimate"] == pytest.approx((60 * 3010 + 4000) / 61)
    diff = view["difference"]
    assert diff["pairs"] == 60 and diff["estimate"] == pytest.approx(-2010.0)
    seq = DifferenceSequence(0.05)  # the same pairs on [0, 1], scaled back by the range
    for i in range(60):
        seq.add(0.25, (3000 + 10 * (i % 3)) / 4000)
    assert diff["cs_low"] == pytest.approx(seq.interval().low * 4000)
    assert diff["cs_high"] == pytest.approx(seq.interval().high * 4000)
    assert diff["cs_high"] < 0  # a spent less: lower spend is better
    assert (view["decision"], view["better"]) == ("stop_a_better", "lower")
    assert (view["metric_min"], view["metric_max"]) == (0.0, 4000.0)
    empty = experiment_view(e, [])["difference"]
    assert (empty["cs_low"], empty["cs_high"]) == (-4000.0, 4000.0)


def test_a_reward_range_and_futility_in_its_units() -> None:
    e = exp(metric="reward", metric_min=-1, metric_max=1, min_effect=0.5)
    done = [_spend(2 * i + k, arm, r) for i in range(400)
            for k, (arm, r) in enumerate((("a", 0.5), ("b", 0.5 - 0.1 * (i % 2))))]
    view = experiment_view(e, done)
    assert view["better"] == "higher" and view["decision"] == "stop_futile"
    assert -0.5 < view["difference"]["cs_low"] < 0.05 < view["difference"]["cs_high"] < 0.5


def test_the_settings_record_gives_back_the_metric() -> None:
    e = exp(metric="pass_at_tier", tier=25)
    record = settings_record(e, "zero")
    assert record["reward_on_exhausted"] == "zero"
    assert experiment_from_record(record) == e
    t = exp(metric="tokens", metric_max=5000, min_effect=500)
    assert experiment_from_record(settings_record(t)) == t


def test_a_kept_entry_round_trips_with_its_value() -> None:
    entry = _spend(3, "a", 1234.5)
    assert Finished.from_json(entry.to_json()) == entry
    older = {"id": "e", "task": "t", "arm": "a", "success": True,
             "ended_at": "2026-12-06T10:00:00.000Z"}  # kept before metrics had values
    assert Finished.from_json(older).outcome == 1.0


def test_a_task_counts_once_when_whole_tasks_are_the_unit() -> None:
    """Episodes of one task share its arm and its difficulty: a few tasks repeated many
    times are a few pairs, not many (an easy task in one arm and a hard one in the other
    would otherwise look like an effect of the arms)."""
    e = exp(unit="task", arms=[{"name": "a"}, {"name": "b"}])
    done = [finished(i, "a" if i % 2 else "b", bool(i % 2), task=f"t{i % 4}")
            for i in range(400)]
    view = experiment_view(e, done)
    assert view["difference"]["pairs"] == 2  # four tasks, two in each arm
    assert view["decision"] == "continue"
    assert [a["episodes"] for a in view["arms"]] == [200, 200]  # the estimates use them all
    assert view["arms"][0]["estimate"] == 1.0 and view["arms"][1]["estimate"] == 0.0
    per_episode = experiment_view(exp(unit="episode", arms=[{"name": "a"}, {"name": "b"}]),
                                  [finished(i, "a" if i % 2 else "b", bool(i % 2),
                                            task=f"t{i % 4}") for i in range(400)])
    assert per_episode["difference"]["pairs"] == 0  # each task has one arm: none on a task


def test_arms_of_different_budgets_carry_a_caution() -> None:
    assert experiment_view(exp(), [])["caution"] is not None  # budgets None and 4
    same = exp(arms=[{"name": "a"}, {"name": "b", "disclosure": "disclosed"}])
    assert experiment_view(same, [])["caution"] is None
