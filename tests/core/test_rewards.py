"""Rewards after the budget rule and GRPO advantages (pure)."""

from __future__ import annotations

import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st

from budgetproxy.core.rewards import advantages, final_reward


def test_final_reward_rules() -> None:
    assert final_reward(0.7, "failure", "exhausted", "zero") == 0.0
    assert final_reward(0.7, "failure", "exhausted", "keep") == 0.7
    assert final_reward(None, None, "exhausted", "keep") == 0.0
    assert final_reward(None, "success", "success", "zero") == 1.0
    assert final_reward(0.3, "success", "success", "zero") == 0.3
    assert final_reward(None, "failure", "failure", "keep") == 0.0
    assert final_reward(None, None, "abandoned", "keep") is None
    assert final_reward(1.0, None, None, "keep") is None  # still running


@given(st.lists(st.floats(-10, 10, allow_nan=False), min_size=2, max_size=16))
def test_advantages_match_the_definition(rewards: list[float]) -> None:
    mean = statistics.fmean(rewards)
    assert advantages(rewards, scale_by_std=False) == pytest.approx(
        [r - mean for r in rewards], abs=1e-9)
    std = statistics.stdev(rewards)
    assert advantages(rewards, scale_by_std=True) == pytest.approx(
        [(r - mean) / (std + 1e-6) for r in rewards], abs=1e-6)


def test_advantages_leave_out_missing_rewards() -> None:
    assert advantages([1.0, None, 0.0], scale_by_std=False) == [0.5, None, -0.5]
    assert advantages([None, None], scale_by_std=True) == [None, None]
    assert advantages([2.0], scale_by_std=True) == [0.0]
