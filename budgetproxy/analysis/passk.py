"""The Pass@(K,T) estimator and its budget arithmetic: pure functions, no I/O.

`budgetmix_candidates` is the proxy's own (core.budget): the audit checks the grid it draws from.
"""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction

from budgetproxy.core.budget import budgetmix_candidates

Number = int | str | Decimal | Fraction

__all__ = [
    "budgetmix_candidates",
    "is_eligible",
    "pass_at_k",
    "round_half_up",
    "succeeded_within",
    "tier_to_turns",
    "to_fraction",
]


def to_fraction(value: Number) -> Fraction:
    """An exact rational from an int, a decimal string ("12.5", "25%"), a Decimal or a Fraction.

    Floats are refused on purpose: 0.1 is not one tenth, and rounding at .5 must be exact.
    """
    if isinstance(value, bool) or isinstance(value, float):
        raise TypeError("pass an int, str, Decimal or Fraction, not a float")
    if isinstance(value, str):
        value = value.strip().removesuffix("%").strip()
    return Fraction(value)


def round_half_up(value: Number) -> int:
    """Round to the nearest integer, halves towards +infinity (2.5 → 3, 1.5 → 2, -2.5 → -2)."""
    return math.floor(to_fraction(value) + Fraction(1, 2))


def tier_to_turns(percent: Number, max_turns: int) -> int:
    """The budget T of a tier: max(1, round_half_up(percent/100 × max_turns)), exactly."""
    if max_turns < 1:
        raise ValueError(f"max_turns must be at least 1, got {max_turns}")
    return max(1, round_half_up(to_fraction(percent) / 100 * max_turns))


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased Pass@K from n samples with c successes: 1 − C(n−c, K)/C(n, K).

    Computed as 1 − ∏_{i=n−c+1}^{n} (1 − K/i), which never forms the large binomials.
    """
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n, got n={n}, k={k}")
    if n - c < k:
        return 1.0
    product = 1.0
    for i in range(n - c + 1, n + 1):
        product *= 1.0 - k / i
    return 1.0 - product


def is_eligible(disclosure: str, budget: int, announced_budget: int | None, t: int) -> bool:
    """Whether an episode counts at budget T.

    Hidden: budget ≥ T (a budget the agent cannot see does not change its first T turns, so
    truncating at T is exact). Disclosed: budget = T and no different announced budget (the
    agent was told T and planned for it).
    """
    if disclosure == "hidden":
        return budget >= t
    if disclosure == "disclosed":
        return budget == t and (announced_budget is None or announced_budget == t)
    return False


def succeeded_within(success: bool, success_turn: int | None, t: int) -> bool:
    """Whether a successful episode had succeeded by turn T."""
    return success and success_turn is not None and success_turn <= t
