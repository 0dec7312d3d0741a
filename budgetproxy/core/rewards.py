"""Rewards after the budget rule, and GRPO-style advantages over a group's episodes."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

OnExhausted = Literal["zero", "keep"]
STD_EPSILON = 1e-6


def final_reward(
    reward: float | None, outcome: str | None, end_reason: str | None, on_exhausted: OnExhausted
) -> float | None:
    """An ended episode's reward: the one the harness reported, else 1.0 for a reported
    success and 0.0 for a reported failure or an exhausted budget; None while it runs or when
    it was abandoned with no report. `on_exhausted: zero` makes an exhausted episode's reward
    0 whatever was reported (BudgetMix RL: running out without finishing earns nothing); an
    episode whose success was reported ends as a success, not exhausted, and keeps its own."""
    if end_reason is None:
        return None
    if end_reason == "exhausted" and on_exhausted == "zero":
        return 0.0
    if reward is not None:
        return float(reward)
    if outcome == "success":
        return 1.0
    if outcome == "failure" or end_reason == "exhausted":
        return 0.0
    return None


def advantages(rewards: Sequence[float | None], *, scale_by_std: bool) -> list[float | None]:
    """GRPO advantages: each reward minus the mean of the group's rewards, divided by their
    standard deviation (n - 1 in the denominator, as torch.std) plus 1e-6 when
    `scale_by_std`. Episodes without a reward get None and are left out of the mean."""
    known = [r for r in rewards if r is not None]
    if not known:
        return [None] * len(rewards)
    mean = math.fsum(known) / len(known)
    scale = 1.0
    if scale_by_std:
        var = math.fsum((r - mean) ** 2 for r in known) / (len(known) - 1) if len(
            known) > 1 else 0.0
        scale = math.sqrt(var) + STD_EPSILON
    return [None if r is None else (r - mean) / scale for r in rewards]
