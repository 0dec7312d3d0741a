"""Likelihood statistics on constructed values: length matching, LLR and NLL summaries."""

from __future__ import annotations

import pytest

from budgetproxy.likelihood.stats import (
    StepScore,
    TrajectoryScore,
    bootstrap,
    length_matched,
    llr_summary,
    match_pairs,
    per_step,
    step_difference,
    within,
)


def traj(task: str, side: str, eid: str, tokens: int, llr: float | None = 0.0,
         ref_nll: float = 0.0, success: bool | None = True) -> TrajectoryScore:
    return TrajectoryScore(task, side, eid, success, ref_nll, llr, tokens)


def test_within_is_ten_percent_of_the_longer() -> None:
    assert within(100, 90, 0.1) and within(90, 100, 0.1)
    assert not within(100, 89, 0.1)
    assert within(0, 0, 0.1) and not within(0, 1, 0.1)


def test_pairs_are_one_to_one_closest_first_within_a_task() -> None:
    rows = [
        traj("t1", "a", "a1", 100), traj("t1", "a", "a2", 120),
        traj("t1", "b", "b1", 109), traj("t1", "b", "b2", 118), traj("t1", "b", "b3", 95),
        traj("t2", "a", "a3", 50), traj("t2", "b", "b4", 200),  # too far apart
        traj("t3", "b", "b5", 100),  # another task's trajectory never pairs with t1's
    ]
    pairs = {(x.episode_id, y.episode_id) for x, y in match_pairs(rows, 0.1)}
    # a2–b2 (2 tokens apart) first, then a1–b3 (5) before a1–b1 (9)
    assert pairs == {("a2", "b2"), ("a1", "b3")}
    assert match_pairs(rows, 0.0) == []


def test_length_matched_difference_and_interval() -> None:
    rows = []
    for i in range(12):  # 12 tasks, one pair each: A's LLR exceeds B's by 10 + i
        rows += [traj(f"t{i:02}", "a", f"a{i}", 100, llr=20.0 + i, ref_nll=50.0),
                 traj(f"t{i:02}", "b", f"b{i}", 105, llr=10.0, ref_nll=40.0 + i)]
    out = length_matched(match_pairs(rows, 0.1), 0.1, 1000, 0)
    assert out["n_pairs"] == 12 and out["n_tasks"] == 12 and out["few_tasks"] is False
    assert out["diff_nats"] == pytest.approx(10 + 5.5)
    assert 10 <= out["ci_low"] < out["diff_nats"] < out["ci_high"] <= 21
    assert out["ref_nll_diff_nats"] == pytest.approx(10 - 5.5)
    assert out["a_tokens_mean"] == 100 and out["b_tokens_mean"] == 105


def test_pairs_without_a_policy_llr_leave_diff_out_but_keep_reference_nll() -> None:
    rows = [traj("t1", "a", "a1", 10, llr=None, ref_nll=5), traj("t1", "b", "b1", 10,
                                                                   ref_nll=3)]
    out = length_matched(match_pairs(rows, 0.1), 0.1, 100, 0)
    assert out["n_pairs"] == 0 and out["diff_nats"] is None and out["ci_low"] is None
    assert out["n_pairs_ref"] == 1 and out["ref_nll_diff_nats"] == 2
    assert out["few_tasks"] is True


def test_bootstrap_over_one_task_is_its_value_and_skips_undefined() -> None:
    assert bootstrap({"t": [1.0, 3.0]}, lambda rs: sum(rs) / len(rs), 50, 0) == (2.0, 2.0)
    assert bootstrap({}, lambda rs: 0.0, 50, 0) == (None, None)
    assert bootstrap({"t": [1.0]}, lambda rs: None, 50, 0) == (None, None)


def test_per_step_mean_quantiles_and_difference() -> None:
    steps = [StepScore(f"t{i % 3}", "a", float(i), 2) for i in range(1, 11)]
    steps += [StepScore(f"t{i % 3}", "b", float(i) + 1, 1) for i in range(1, 11)]
    a = per_step([s for s in steps if s.side == "a"], 200, 0)
    assert a["nll_mean"] == 5.5 and a["n"] == 10 and a["n_tasks"] == 3
    assert a["nll_per_token"] == 2.75 and a["tokens"] == 20
    assert a["quantiles"] == {"p10": 1.0, "p50": 5.0, "p90": 9.0}
    d = step_difference(steps, 200, 0)
    assert d["nll_diff"] == pytest.approx(-1.0) and d["few_tasks"] is True
    assert per_step([], 10, 0)["nll_mean"] is None


def test_llr_summary_counts_only_trajectories_that_have_it() -> None:
    rows = [traj("t1", "a", "x", 5, llr=4.0), traj("t2", "a", "y", 5, llr=None),
            traj("t2", "a", "z", 7, llr=2.0)]
    out = llr_summary(rows, 100, 0)
    assert out["llr_mean"] == 3.0 and out["n"] == 2 and out["n_tasks"] == 2
    assert out["tokens_mean"] == 6.0
