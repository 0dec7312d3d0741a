"""Probe statistics: win and tie rates, depth split, bootstrap CIs over tasks."""

from __future__ import annotations

import pytest

from budgetproxy.probe.stats import Compared, Continued, summarize, summarize_continuation


def test_wins_ties_and_depths_are_counted_apart() -> None:
    rows = [Compared("t1", 0.1, 0.9, 0.5), Compared("t1", 0.5, 0.5, 0.5),
            Compared("t2", 0.9, 0.2, 0.6), Compared("t2", 0.95, 0.7, 0.1)]
    out = summarize(rows, resamples=200, seed=1)
    assert (out["win_rate"], out["tie_rate"], out["n_states"], out["n_tasks"]) == (
        0.5, 0.25, 4, 2)
    assert abs(out["mean_diff"] - (0.4 + 0 - 0.4 + 0.6) / 4) < 1e-12
    assert 0.0 <= out["ci_low"] <= out["win_rate"] <= out["ci_high"] <= 1.0
    depth = {d["depth"]: d for d in out["by_depth"]}
    assert (depth["early"]["n_states"], depth["middle"]["n_states"],
            depth["late"]["n_states"]) == (1, 1, 2)
    assert depth["late"]["win_rate"] == 0.5 and depth["middle"]["tie_rate"] == 1.0
    assert "correction" not in out
    assert out["net_win"] == (2 - 1) / 4
    assert out["diff_ci_low"] <= out["mean_diff"] <= out["diff_ci_high"]
    assert -1.0 <= out["net_ci_low"] <= out["net_win"] <= out["net_ci_high"] <= 1.0
    assert out["by_task"] == [
        {"task_id": "t1", "win_rate": 0.5, "tie_rate": 0.5, "n_states": 2, "mean_diff": 0.2,
         "net_win": 0.5},
        {"task_id": "t2", "win_rate": 0.5, "tie_rate": 0.0, "n_states": 2,
         "mean_diff": pytest.approx(0.1), "net_win": 0.0},
    ]


def test_a_view_without_states_has_nulls_and_the_ci_is_seeded() -> None:
    assert summarize([])["win_rate"] is None and summarize([])["n_states"] == 0
    rows = [Compared(f"t{i % 5}", 0.5, float(i % 3 == 0), 0.5) for i in range(40)]
    assert summarize(rows, seed=3) == summarize(rows, seed=3)


def test_continuation_ci_is_of_a_minus_b() -> None:
    rows = [Continued("t1", 1.0, 0.0), Continued("t2", 0.5, 0.5), Continued("t3", 1.0, 0.25)]
    out = summarize_continuation(rows, resamples=500)
    assert out["a_success"] == 2.5 / 3 and out["b_success"] == 0.75 / 3
    assert -1.0 <= out["ci_low"] <= out["a_success"] - out["b_success"] <= out["ci_high"] <= 1.0
    assert summarize_continuation([])["n_states"] == 0


def test_views_on_fewer_than_ten_tasks_say_few_tasks() -> None:
    two = [Compared(f"t{i % 2}", 0.5, 1.0, 0.0) for i in range(20)]
    ten = [Compared(f"t{i % 10}", 0.5, 1.0, 0.0) for i in range(20)]
    out = summarize(two, resamples=50)
    assert out["few_tasks"] is True and out["n_tasks"] == 2
    assert all(d["few_tasks"] is (d["n_states"] > 0) for d in out["by_depth"])
    assert summarize(ten, resamples=50)["few_tasks"] is False
    assert summarize([])["few_tasks"] is False  # nothing to flag: no value
    cont = summarize_continuation([Continued("t1", 1.0, 0.0), Continued("t2", 1.0, 0.5)], 50)
    assert cont["few_tasks"] is True
    many = [Continued(f"t{i}", 1.0, 0.0) for i in range(12)]
    assert summarize_continuation(many, 50)["few_tasks"] is False
