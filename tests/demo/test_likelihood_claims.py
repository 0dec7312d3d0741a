"""The demo's likelihood sentences: a difference is named only where its interval excludes
zero over 10+ maps; every figure carries its interval."""

from __future__ import annotations

from typing import Any

from budgetproxy.demo.likelihood import claims


def _result(n_tasks: int, few: bool, lo: float = -1.6, hi: float = -1.4) -> dict[str, Any]:
    side = {"nll_mean": 0.5, "ci_low": 0.3, "ci_high": 0.9, "n": 40, "n_tasks": n_tasks,
            "few_tasks": few}
    diff = {"nll_diff": -1.5, "ci_low": lo, "ci_high": hi, "n_tasks": n_tasks,
            "few_tasks": few}
    llr = {"llr_mean": 12.0, "ci_low": 3.0, "ci_high": 30.0, "n": 9, "n_tasks": n_tasks,
           "few_tasks": few}
    empty = {"llr_mean": None, "ci_low": None, "ci_high": None, "n": 0, "n_tasks": 0,
             "few_tasks": False}
    return {"per_step": {"a": side, "b": {**side, "nll_mean": 2.0}, "diff": diff},
            "trajectory_llr": {"a_success": empty, "a_failure": empty, "b_success": llr,
                               "b_failure": empty},
            "length_matched": {"diff_nats": -4.0, "ci_low": lo, "ci_high": hi, "n_pairs": 12,
                               "n_tasks": n_tasks, "few_tasks": few, "tolerance": 0.1}}


def test_no_difference_is_named_from_two_maps() -> None:
    text = "\n".join(claims(_result(2, True)))
    assert text.count("2 maps: fewer than 10, too few to name a difference") == 2
    assert "likelier" not in text and "stray further" not in text
    assert "95% CI 0.30 to 0.90" in text and "95% CI -1.60 to -1.40" in text
    assert "too few to lean on" in text


def test_differences_are_named_from_twelve_maps_only_when_the_interval_excludes_zero() -> None:
    text = "\n".join(claims(_result(12, False)))
    # careful − recovering < 0: recovering's actions cost careful more nats
    assert "careful's own actions are the likelier under careful" in text
    assert "recovering's trajectories stray further from careful at the same length" in text
    text = "\n".join(claims(_result(12, False, lo=-0.5, hi=0.4)))
    assert text.count("the interval includes no difference") == 2


def test_nothing_scored_says_so() -> None:
    result = _result(2, True)
    result["per_step"]["a"]["n"] = 0
    assert claims(result)[-1] == "- no actions were scored."
