"""The demo's probe sentences: a winner is named only where the interval rests on 10+ tasks."""

from __future__ import annotations

from typing import Any

from budgetproxy.demo.probe import claims


def _view(n_tasks: int, few: bool) -> dict[str, Any]:
    return {"n_states": 32, "n_tasks": n_tasks, "few_tasks": few, "win_rate": 0.8,
            "tie_rate": 0.1, "ci_low": 0.7, "ci_high": 0.9, "net_win": 0.7, "net_ci_low": 0.5,
            "net_ci_high": 0.9, "mean_diff": 0.2, "diff_ci_low": 0.1, "diff_ci_high": 0.3}


def _result(n_tasks: int, few: bool) -> dict[str, Any]:
    errors = {**_view(n_tasks, few), "net_win": -0.5, "net_ci_low": -0.8, "net_ci_high": -0.2,
              "mean_diff": -0.2, "diff_ci_low": -0.3, "diff_ci_high": -0.1}
    return {"single_step": _view(n_tasks, few), "error_states": errors,
            "continuation": {"a_success": 0.2, "b_success": 0.6, "ci_low": -0.6,
                             "ci_high": -0.2, "n_states": 16, "n_tasks": n_tasks,
                             "few_tasks": few}}


def test_no_winner_is_named_from_two_maps() -> None:
    text = "\n".join(claims(_result(2, True)))
    assert "wins" not in text and "as expected" not in text
    assert text.count("2 maps: fewer than 10, too few to name a winner") == 3
    assert "95% CI" in text  # the figures are still shown, with their intervals


def test_a_winner_is_named_from_ten_maps() -> None:
    text = "\n".join(claims(_result(12, False)))
    assert "careful wins — as expected" in text and "recovering wins — as expected" in text
    assert "too few" not in text
