"""Finish mode's final reply: the text that names the budget axis that ran out."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from budgetproxy.core import axes
from budgetproxy.core.episode import EpisodeState

AXES = ("turns", "tokens", "cost", "time")


def _numbers(st: EpisodeState, axis: str, now: float) -> tuple[Any, Any]:
    if axis == "tokens":
        return st.token_budget, st.tokens_used
    if axis == "cost":
        return st.cost_budget, round(st.cost_used, 6)
    if axis == "time":
        total = st.time_budget_s
        if total is not None and float(total).is_integer():
            total = int(total)  # "600", not "600.0"
        return total, int(axes.time_used(st, now))
    return st.budget, st.turns_used


def finish_text(texts: Mapping[str, str], st: EpisodeState, now: float) -> str:
    """The final reply's text for an exhausted episode: the template (`texts`, by axis) of
    the axis that ran out (turns when none is named), with `{total}` and `{used}` of it."""
    axis = st.spent_axis or "turns"
    if axis not in AXES:
        axis = "turns"
    total, used = _numbers(st, axis, now)
    template = texts[axis]
    try:
        return template.format(total="n/a" if total is None else total, used=used)
    except (ValueError, TypeError):  # a format spec this axis's values do not take ({:d})
        return template
