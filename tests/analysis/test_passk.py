"""The pure Pass@(K,T) estimator, budget arithmetic and statistics, without I/O."""

from __future__ import annotations

import itertools
import math
from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from budgetproxy.analysis.passk import (
    budgetmix_candidates,
    is_eligible,
    pass_at_k,
    round_half_up,
    succeeded_within,
    tier_to_turns,
)
from budgetproxy.analysis.stats import bootstrap_ci, chi_square, chi_square_sf


def brute_force(n: int, c: int, k: int) -> Fraction:
    """Share of all K-subsets of n samples (the first c successes) with at least one success."""
    subsets = list(itertools.combinations(range(n), k))
    return Fraction(sum(1 for s in subsets if min(s) < c), len(subsets))


@given(st.integers(1, 10).flatmap(lambda n: st.tuples(
    st.just(n), st.integers(0, n), st.integers(1, n))))  # fmt: skip
def test_estimator_matches_enumeration_over_all_k_subsets(case: tuple[int, int, int]) -> None:
    n, c, k = case
    assert pass_at_k(n, c, k) == pytest.approx(float(brute_force(n, c, k)), abs=1e-12)


@given(st.integers(1, 300), st.data())
def test_estimator_matches_exact_binomials(n: int, data: st.DataObject) -> None:
    c = data.draw(st.integers(0, n))
    k = data.draw(st.integers(1, n))
    exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
    assert pass_at_k(n, c, k) == pytest.approx(float(exact), rel=1e-9, abs=1e-12)


# Hand-computed: 1 - C(n-c, k) / C(n, k).
@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (1, 0, 1, 0.0),
        (1, 1, 1, 1.0),
        (4, 1, 1, 0.25),
        (4, 1, 2, 0.5),  # 1 - C(3,2)/C(4,2) = 1 - 3/6
        (4, 2, 2, 5 / 6),  # 1 - C(2,2)/C(4,2) = 1 - 1/6
        (8, 1, 4, 0.5),  # 1 - C(7,4)/C(8,4) = 1 - 35/70
        (8, 2, 4, 1 - 15 / 70),  # C(6,4) = 15
        (10, 3, 1, 0.3),
        (10, 3, 8, 1.0),  # fewer than K failures: every K-subset holds a success
        (5, 0, 5, 0.0),
    ],
)
def test_estimator_hand_computed(n: int, c: int, k: int, expected: float) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_estimator_is_stable_for_large_n() -> None:
    # C(5000, 2500) overflows a float; the product form does not.
    assert pass_at_k(5000, 1, 2500) == pytest.approx(0.5)
    assert 0 < pass_at_k(100_000, 3, 1) < 1


@pytest.mark.parametrize(("n", "c", "k"), [(3, 4, 1), (3, -1, 1), (3, 1, 4), (3, 1, 0)])
def test_estimator_rejects_impossible_counts(n: int, c: int, k: int) -> None:
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (Fraction(5, 2), 3),
        (Fraction(3, 2), 2),
        (Fraction(1, 2), 1),
        (Fraction(-5, 2), -2),
        (Fraction(249, 100), 2),
        ("2.5", 3),
        (Decimal("0.5"), 1),
        (7, 7),
    ],
)
def test_round_half_up(value: Fraction | str | Decimal | int, expected: int) -> None:
    assert round_half_up(value) == expected


def test_round_half_up_refuses_floats() -> None:
    with pytest.raises(TypeError):
        round_half_up(2.5)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("percent", "max_turns", "expected"),
    [
        (25, 10, 3),  # 2.5 rounds up, not to even
        (25, 6, 2),  # 1.5 → 2
        (25, 2, 1),  # 0.5 → 1
        (10, 4, 1),  # 0.4 → 0, then max(1, ·)
        (1, 1, 1),
        (75, 10, 8),  # 7.5 → 8
        (50, 5, 3),  # 2.5 → 3
        (100, 37, 37),
        ("12.5", 20, 3),  # 2.5 → 3, from a decimal string
        ("25%", 10, 3),
        (Fraction(1, 3), 300, 1),
    ],
)
def test_tier_to_turns(percent: int | str | Fraction, max_turns: int, expected: int) -> None:
    assert tier_to_turns(percent, max_turns) == expected


def test_tier_to_turns_is_exact_where_floats_are_not() -> None:
    # 0.35 * 10 == 3.4999999999999996 in floats; exactly 3.5 → 4
    assert tier_to_turns("35", 10) == 4
    assert tier_to_turns(Fraction(7, 20) * 100, 10) == 4


def test_budgetmix_candidates() -> None:
    assert budgetmix_candidates(20) == [2, 4, 6, 8, 10, 12, 14, 16, 18, 20]
    assert budgetmix_candidates(10, "0.25") == [3, 5, 8, 10]  # 2.5 → 3, 7.5 → 8
    # small max_turns: values repeat, the draw stays uniform over the index
    assert budgetmix_candidates(5) == [1, 1, 2, 2, 3, 3, 4, 4, 5, 5]
    assert budgetmix_candidates(3, Fraction(1, 3)) == [1, 2, 3]
    assert len(budgetmix_candidates(40, "0.3")) == 3  # round(1/0.3) = 3
    with pytest.raises(ValueError):
        budgetmix_candidates(10, "0")


@pytest.mark.parametrize(
    ("arm", "budget", "announced", "t", "expected"),
    [
        ("hidden", 10, None, 10, True),
        ("hidden", 10, None, 4, True),  # truncation of a hidden budget is exact
        ("hidden", 3, None, 4, False),
        ("disclosed", 10, None, 10, True),
        ("disclosed", 10, None, 4, False),  # told 10, planned for 10: not a T=4 episode
        ("disclosed", 4, 4, 4, True),
        ("disclosed", 4, 8, 4, False),  # announced a different budget
        ("mixed", 4, None, 4, False),
    ],
)
def test_eligibility(arm: str, budget: int, announced: int | None, t: int, expected: bool) -> None:
    assert is_eligible(arm, budget, announced, t) is expected


def test_success_within_t() -> None:
    assert succeeded_within(True, 3, 3)
    assert not succeeded_within(True, 4, 3)
    assert not succeeded_within(False, 1, 3)
    assert not succeeded_within(True, None, 3)


@pytest.mark.parametrize(
    ("x", "dof", "expected"),
    [
        (3.841458820694124, 1, 0.05),
        (18.307038053275146, 10, 0.05),
        (5.0, 2, math.exp(-2.5)),  # dof 2: exactly exp(-x/2)
        (0.5, 3, 0.9188914116546758),
        (100.0, 50, 3.4549313829848695e-05),
        (0.0, 4, 1.0),
    ],
)
def test_chi_square_survival(x: float, dof: int, expected: float) -> None:
    assert chi_square_sf(x, dof) == pytest.approx(expected, rel=1e-9)


def test_chi_square_statistic() -> None:
    assert chi_square([10, 20], [15, 15]) == pytest.approx(25 / 15 * 2)


def test_bootstrap_is_seeded_and_brackets_the_mean() -> None:
    values = [0.0, 1.0, 0.5, 0.25, 1.0, 0.0, 0.3, 0.9]
    low, high = bootstrap_ci(values, resamples=1000, seed=0)
    assert (low, high) == bootstrap_ci(values, resamples=1000, seed=0)
    assert low < sum(values) / len(values) < high
    assert (low, high) != bootstrap_ci(values, resamples=1000, seed=1)
    assert bootstrap_ci([0.4], seed=0) == (0.4, 0.4)
    assert bootstrap_ci([0.7, 0.7, 0.7]) == (0.7, 0.7)
