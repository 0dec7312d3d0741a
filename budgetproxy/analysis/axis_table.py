"""Pass@(K,B) cells and paired differences along any axis, from episodes `axis.load` read.

A cell is (slice of the --by fields, levels of the other axes, B column, K); its numbers come
from per-task counts (n eligible, c succeeded within) exactly as the turn table's do
(`table.estimate`, `compare.paired`), with `axis_rule` deciding who counts.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from budgetproxy.analysis.axis_rule import (
    AXES,
    AxisEpisode,
    Column,
    eligible,
    holds_of,
    number_label,
    succeeded_within,
)
from budgetproxy.analysis.compare import (
    Comparison,
    excludes_zero,
    format_differences,
    paired,
    significant,
)
from budgetproxy.analysis.stats import few_tasks, piled
from budgetproxy.analysis.table import estimate, format_cells, slice_order, task_values

By = tuple[tuple[str, str | None], ...]
Hold = dict[str, float | None]


def _hold_columns(hold: Mapping[str, float | None]) -> By:
    return tuple((f"{y} cap", "none" if v is None else number_label(v))
                 for y, v in hold.items())


@dataclass(frozen=True)
class AxisCell:
    """Pass@(K,B) of one slice at one B column with the other axes at `hold`."""

    k: int
    axis: str
    budget: Column
    hold: Hold
    by: By
    value: float | None
    ci_low: float | None
    ci_high: float | None
    n_tasks: int
    n_tasks_left_out: int
    n_episodes: int
    tasks_eligible: int
    episodes_eligible: int
    ci_note: str | None = None
    # most of its tasks' estimates at exactly 1 (or 0): the interval understates (stats.piled)
    piled: bool = False

    @property
    def columns(self) -> By:
        return self.by + _hold_columns(self.hold)

    @property
    def few_tasks(self) -> bool:
        return self.value is not None and few_tasks(self.n_tasks, self.n_episodes, self.k)

    def as_json(self) -> dict[str, Any]:
        row: dict[str, Any] = {"k": self.k, "axis": self.axis, **_budget_json(self)}
        row.update(value=self.value, ci_low=self.ci_low, ci_high=self.ci_high,
                   n_tasks=self.n_tasks, n_tasks_left_out=self.n_tasks_left_out,
                   n_episodes=self.n_episodes, by=dict(self.by), hold=self.hold,
                   ci_note=self.ci_note, few_tasks=self.few_tasks, piled=self.piled)
        return row


@dataclass(frozen=True)
class AxisDifference:
    """A paired difference A − B of Pass@(K,B) along an axis, over the tasks both have."""

    comparison: Comparison
    k: int
    axis: str
    budget: Column
    hold: Hold
    by: By  # the other --by fields
    diff: float | None
    ci_low: float | None
    ci_high: float | None
    a_value: float | None
    b_value: float | None
    n_tasks: int
    n_tasks_unpaired: int
    ci_note: str | None = None
    n_episodes: int = 0
    p_value: float | None = None
    p_adjusted: float | None = None
    adjust: str = "none"

    @property
    def columns(self) -> By:
        return self.by + _hold_columns(self.hold)

    @property
    def excludes_zero(self) -> bool:
        return excludes_zero(self.ci_low, self.ci_high, self.ci_note)

    @property
    def few_tasks(self) -> bool:
        return self.diff is not None and few_tasks(self.n_tasks, self.n_episodes, self.k)

    @property
    def significant(self) -> bool:
        return significant(self)

    def as_json(self) -> dict[str, Any]:
        c = self.comparison
        row: dict[str, Any] = {"field": c.field, "a": c.a, "b": c.b, "k": self.k,
                               "axis": self.axis, **_budget_json(self)}
        row.update(diff=self.diff, ci_low=self.ci_low, ci_high=self.ci_high,
                   a_value=self.a_value, b_value=self.b_value, n_tasks=self.n_tasks,
                   n_tasks_unpaired=self.n_tasks_unpaired, n_episodes=self.n_episodes,
                   by=dict(self.by), hold=self.hold, ci_note=self.ci_note,
                   few_tasks=self.few_tasks,
                   excludes_zero=self.excludes_zero, p_value=self.p_value,
                   p_adjusted=self.p_adjusted, adjust=self.adjust,
                   significant=self.significant)
        return row


def _budget_json(cell: AxisCell | AxisDifference) -> dict[str, Any]:
    """"budget": B and "tier": null at an absolute B (and "turns": T on the turns axis);
    "budget": null and "tier": "25%" in a tier (B is per episode there)."""
    col = cell.budget
    if col.kind == "tier":
        return {"budget": None, "tier": col.label}
    out: dict[str, Any] = {"budget": float(col.value), "tier": None}
    if cell.axis == "turns":
        out["turns"] = int(col.value)
    return out


# (slice, hold, column index, split value) → task → (n eligible, c succeeded within)
Counts = dict[tuple[tuple[str | None, ...], tuple[float | None, ...], int, str | None],
              dict[str, tuple[int, int]]]


def task_counts(episodes: Sequence[AxisEpisode], axis: str, columns: Sequence[Column],
                fixed: Mapping[str, float | None], by: Sequence[str], split: str | None = None
                ) -> tuple[list[tuple[tuple[str | None, ...], Hold]], Counts]:
    """The (slice, hold) pairs in report order, and per (slice, hold, column, split value)
    and task: episodes in the column, how many count, how many succeeded within. A task is
    listed in a column when one of its episodes is in it (n may be 0, as in the turn table).
    The holds are those of each slice (both compared values together)."""
    slices: dict[tuple[str | None, ...], list[AxisEpisode]] = defaultdict(list)
    for ep in episodes:
        fields = dict(ep.by)
        slices[tuple(fields.get(name) for name in by)].append(ep)
    order: list[tuple[tuple[str | None, ...], Hold]] = []
    counts: Counts = {}
    for key in sorted(slices, key=slice_order):
        eps = slices[key]
        for hold in holds_of(eps, axis, fixed):
            order.append((key, hold))
            hold_key = tuple(hold.get(y) for y in AXES if y != axis)
            for idx, column in enumerate(columns):
                for ep in eps:
                    b = column.budget_of(ep, axis)
                    if b is None:
                        continue
                    value = dict(ep.by).get(split) if split is not None else None
                    per = counts.setdefault((key, hold_key, idx, value), {})
                    n, c = per.get(ep.task_id, (0, 0))
                    if eligible(ep, axis, b, hold):
                        n, c = n + 1, c + succeeded_within(ep, axis, b, hold)
                    per[ep.task_id] = (n, c)
    return order, counts


def compute(episodes: Sequence[AxisEpisode], axis: str, columns: Sequence[Column],
            ks: Sequence[int], fixed: Mapping[str, float | None], by: Sequence[str] = (),
            resamples: int = 1000, seed: int = 0) -> list[AxisCell]:
    """Every (slice, hold, column, K) cell, in that order, with bootstrap CIs over tasks."""
    order, counts = task_counts(episodes, axis, columns, fixed, by)
    cells = []
    for key, hold in order:
        hold_key = tuple(hold.get(y) for y in AXES if y != axis)
        for idx, column in enumerate(columns):
            per = counts.get((key, hold_key, idx, None), {})
            tasks = [per[t] for t in sorted(per)]
            for k in ks:
                cells.append(AxisCell(k=k, axis=axis, budget=column, hold=dict(hold),
                                      by=tuple(zip(by, key, strict=True)),
                                      **estimate(k, tasks, resamples, seed),
                                      piled=piled(task_values(k, tasks))))
    return cells


def compute_differences(episodes: Sequence[AxisEpisode], comparison: Comparison, axis: str,
                        columns: Sequence[Column], ks: Sequence[int],
                        fixed: Mapping[str, float | None], by: Sequence[str] = (),
                        resamples: int = 1000, seed: int = 0) -> list[AxisDifference]:
    """Every (other slice, hold, column, K) paired difference A − B."""
    others = [f for f in by if f != comparison.field]
    order, counts = task_counts(episodes, axis, columns, fixed, others, comparison.field)
    out = []
    for key, hold in order:
        hold_key = tuple(hold.get(y) for y in AXES if y != axis)
        for idx, column in enumerate(columns):
            a = counts.get((key, hold_key, idx, comparison.a), {})
            b = counts.get((key, hold_key, idx, comparison.b), {})
            for k in ks:
                out.append(AxisDifference(
                    comparison=comparison, k=k, axis=axis, budget=column, hold=dict(hold),
                    by=tuple(zip(others, key, strict=True)),
                    **paired(a, b, k, resamples, seed)))
    return out


def _header(axis: str, columns: Sequence[Column]) -> str:
    kinds = {c.kind for c in columns}
    return f"B ({axis})" if kinds == {"budget"} else f"tier/B ({axis})"


def format_axis_cells(cells: Sequence[AxisCell], resamples: int, seed: int) -> str:
    """The turn table's layout: one row per slice, other-axis caps and B; one column per K."""
    if not cells:
        return "no Pass@(K,B) cells\n"
    axis = cells[0].axis
    return format_cells(cells, resamples, seed, measure=f"Pass@(K,B) along {axis}",
                        column=_header(axis, list(dict.fromkeys(c.budget for c in cells))),
                        letter="B")


def format_axis_differences(diffs: Sequence[AxisDifference], resamples: int, seed: int, *,
                            comparison: Comparison | None = None) -> str:
    if not diffs:
        return format_differences(diffs, resamples, seed, comparison=comparison)
    axis = diffs[0].axis
    return format_differences(diffs, resamples, seed, measure=f"Pass@(K,B) along {axis}",
                              column=_header(axis, list(dict.fromkeys(d.budget for d in diffs))),
                              letter="B", comparison=comparison)
