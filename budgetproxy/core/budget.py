"""Budgets: tiers, BudgetMix candidates and the deterministic per-group draws."""

from __future__ import annotations

import hashlib
from fractions import Fraction

# The largest turn count accepted anywhere (budgets, max_turns, success_turn): a count of turns
# past two billion is a mistake, and every store, log reader and dashboard handles this one.
TURNS_MAX = 2**31 - 1


def round_half_up(x: Fraction) -> int:
    """Round a non-negative exact fraction to the nearest integer, halves going up."""
    return int((x + Fraction(1, 2)) // 1)


def tier_label(budget: int, max_turns: int | None) -> str:
    """budget / max_turns as a percentage rounded to a multiple of 5: "25%"; "n/a" without it."""
    if not max_turns:
        return "n/a"
    pct = Fraction(budget * 100, max_turns)
    return f"{5 * round_half_up(pct / 5)}%"


def budgetmix_candidates(max_turns: int, step: float | str | Fraction = "0.1") -> list[int]:
    """Candidate budgets at step intervals of max_turns: candidate i = 1..round(1/step) is
    min(max_turns, max(1, round_half_up(i × step × max_turns))), at index i - 1.

    Capped at max_turns: a step that does not divide 1 (0.15, 0.4) would otherwise draw a
    budget the proxy itself refuses as outside 1..max_turns. Values can repeat (10% and 20%
    of 5 both give 1, 0.4 of 10 caps 12 to 10); the draw is uniform over i, so a repeated
    value is proportionally more likely. The sampler and the analysis's audit share this.
    """
    step_q = Fraction(str(step))
    if not 0 < step_q <= 1:
        raise ValueError(f"step must be in (0, 1], got {step}")
    if max_turns < 1:
        raise ValueError(f"max_turns must be at least 1, got {max_turns}")
    n = max(1, round_half_up(1 / step_q))
    return [
        min(max_turns, max(1, round_half_up(i * step_q * max_turns))) for i in range(1, n + 1)
    ]


def _unit_draw(*parts: object) -> Fraction:
    """A deterministic draw in [0, 1) from the parts, identical on every replica and restart."""
    key = "\x1f".join("" if p is None else str(p) for p in parts).encode()
    digest = hashlib.sha256(key).digest()
    return Fraction(int.from_bytes(digest[:8], "big"), 1 << 64)


def draw_budgetmix(seed: int, task_id: str | None, group: str, max_turns: int, step: float) -> int:
    """The group's BudgetMix budget: uniform over the candidates, fixed by (seed, task, group)."""
    cands = budgetmix_candidates(max_turns, step)
    u = _unit_draw("budgetmix", seed, task_id, group)
    return cands[int(u * len(cands))]


def draw_disclosed(seed: int, task_id: str | None, group: str, fraction: float) -> bool:
    """The group's arm in mixed mode: disclosed with probability `fraction`, fixed per group."""
    return _unit_draw("arm", seed, task_id, group) < Fraction(str(fraction))


def draw_budgetmix_axis(seed: int, task_id: str | None, group: str, axis: str, full: float,
                        step: float) -> float:
    """A group's BudgetMix budget on an axis beside turns: uniform over i·step·full for
    i = 1..round(1/step) (capped at full), drawn apart from the turn draw (keyed on the axis)."""
    step_q = Fraction(str(step))
    n = max(1, round_half_up(1 / step_q))
    i = int(_unit_draw("budgetmix", axis, seed, task_id, group) * n) + 1
    return float(min(Fraction(str(full)), i * step_q * Fraction(str(full))))
