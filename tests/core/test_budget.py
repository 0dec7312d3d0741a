"""Tiers, BudgetMix candidates and per-group draws, against the contract's exact formulas."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from budgetproxy.core.budget import (
    budgetmix_candidates,
    draw_budgetmix,
    draw_disclosed,
    round_half_up,
    tier_label,
)


def contract_candidates(max_turns: int, step: str) -> list[int]:
    """BudgetMix (docs/episodes.md): n = round(1/step); candidate i =
    max(1, round_half_up(i*step*max_turns))."""
    q = Fraction(step)
    n = round_half_up(1 / q)
    return [max(1, int(i * q * max_turns + Fraction(1, 2))) for i in range(1, n + 1)]


@pytest.mark.parametrize(
    ("max_turns", "step", "expected"),
    [
        (5, 0.1, [1, 1, 2, 2, 3, 3, 4, 4, 5, 5]),
        (20, 0.1, [2, 4, 6, 8, 10, 12, 14, 16, 18, 20]),
        (7, 0.1, [1, 1, 2, 3, 4, 4, 5, 6, 6, 7]),
        (10, 0.25, [3, 5, 8, 10]),
        (3, 0.5, [2, 3]),
        (1, 0.1, [1] * 10),
        (8, 1.0, [8]),
        (12, 0.2, [2, 5, 7, 10, 12]),
    ],
)
def test_budgetmix_candidates_table(max_turns: int, step: float, expected: list[int]) -> None:
    assert budgetmix_candidates(max_turns, step) == expected
    assert contract_candidates(max_turns, str(step)) == expected


@given(
    max_turns=st.integers(1, 400),
    step=st.sampled_from(["0.1", "0.05", "0.2", "0.25", "0.5", "1", "0.125", "0.01"]),
)
def test_budgetmix_candidates_follow_the_formula(max_turns: int, step: str) -> None:
    got = budgetmix_candidates(max_turns, float(step))
    assert got == contract_candidates(max_turns, step)
    assert len(got) == round_half_up(1 / Fraction(step))
    assert got == sorted(got)
    assert got[-1] == max_turns
    assert all(1 <= c <= max_turns for c in got)


@given(
    max_turns=st.integers(1, 200),
    step=st.floats(0.01, 1.0, allow_nan=False).map(lambda f: round(f, 3)).filter(lambda f: f > 0),
)
def test_budgetmix_candidates_are_valid_budgets_for_any_step(max_turns: int, step: float) -> None:
    # A step that does not divide 1 (0.15, 0.4) must not draw a budget above max_turns: such
    # a budget is one the proxy itself refuses ("outside 1..max_turns").
    got = budgetmix_candidates(max_turns, step)
    assert got and all(1 <= c <= max_turns for c in got)


def test_round_half_up_is_exact() -> None:
    assert round_half_up(Fraction(5, 2)) == 3
    assert round_half_up(Fraction(7, 2)) == 4
    assert round_half_up(Fraction(249999, 100000)) == 2
    assert round_half_up(Fraction(1, 2)) == 1
    assert round_half_up(Fraction(0)) == 0


@pytest.mark.parametrize(
    ("budget", "max_turns", "label"),
    [
        (5, 20, "25%"),
        (10, 20, "50%"),
        (20, 20, "100%"),
        (1, 3, "35%"),  # 33.3% → 35
        (1, 8, "15%"),  # 12.5% → half up → 15
        (2, 7, "30%"),  # 28.6%
        (1, 40, "5%"),  # 2.5% → half up → 5
        (1, 41, "0%"),  # 2.44%
        (3, None, "n/a"),
    ],
)
def test_tier_label_table(budget: int, max_turns: int | None, label: str) -> None:
    assert tier_label(budget, max_turns) == label


@given(max_turns=st.integers(1, 500), data=st.data())
def test_tier_label_is_budget_share_rounded_half_up_to_five(
    max_turns: int, data: st.DataObject
) -> None:
    budget = data.draw(st.integers(1, max_turns))
    pct = Fraction(100 * budget, max_turns)
    expected = 5 * int(pct / 5 + Fraction(1, 2))
    assert tier_label(budget, max_turns) == f"{expected}%"


def test_budgetmix_draw_is_deterministic_and_uniform_enough() -> None:
    cands = budgetmix_candidates(20, 0.1)
    draws = [draw_budgetmix(0, "task", f"g{i}", 20, 0.1) for i in range(2000)]
    assert draws == [draw_budgetmix(0, "task", f"g{i}", 20, 0.1) for i in range(2000)]
    assert set(draws) == set(cands)
    for c in cands:  # uniform over i: each of 10 candidates about 200 times
        assert 120 < draws.count(c) < 280, (c, draws.count(c))
    other_seed = [draw_budgetmix(1, "task", f"g{i}", 20, 0.1) for i in range(2000)]
    assert other_seed != draws


def test_mixed_arm_draw_is_deterministic_with_the_fraction() -> None:
    arms = [draw_disclosed(7, "t", f"g{i}", 0.3) for i in range(2000)]
    assert arms == [draw_disclosed(7, "t", f"g{i}", 0.3) for i in range(2000)]
    assert 450 < sum(arms) < 750
    assert not any(draw_disclosed(7, "t", f"g{i}", 0.0) for i in range(200))
    assert all(draw_disclosed(7, "t", f"g{i}", 1.0) for i in range(200))
