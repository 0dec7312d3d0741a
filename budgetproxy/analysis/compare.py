"""Paired differences of Pass@(K,T) between two values of a field, per task, with bootstrap CIs.

`--compare disclosure=disclosed,hidden` (or `model=a,b`, or a tag) asks, per slice of the
other `--by` fields, T and K: on the tasks where both values have at least K eligible
episodes, how much higher is Pass@(K,T) under A than under B? Each such task gives one
difference of its two per-task estimates; the mean difference is the answer, and its
interval comes from resampling those tasks (a paired bootstrap: a task's two estimates stay
together, so what the tasks share — their difficulty — cancels out).

A comparison reads many cells at once (every slice, T and K), so a star per cell whose interval
excludes 0 would name some effects by chance alone. `adjusted` drops the cells with no paired
task and adjusts the cells' bootstrap p-values over the comparison's cells (Holm by default,
or Benjamini-Hochberg); the star then means the adjusted p-value is below 0.05.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol, TypeVar, cast

from budgetproxy.analysis.passk import pass_at_k
from budgetproxy.analysis.stats import (
    ADJUSTMENTS,
    FEW_TASKS_NOTE,
    adjust_p,
    bootstrap_ci,
    bootstrap_p,
    few_tasks,
    zero_width_note,
)
from budgetproxy.analysis.table import Budget, Labelled, slice_order, task_counts

# The level a cell's (adjusted) p-value is starred at: the intervals' 95%.
ALPHA = 0.05


@dataclass(frozen=True)
class Comparison:
    """What to compare: FIELD=A,B; the difference is A − B."""

    field: str
    a: str
    b: str

    @property
    def label(self) -> str:
        return f"{self.field}: {self.a} − {self.b}"


def parse_comparison(text: str) -> Comparison:
    """"FIELD=A,B" → Comparison; ValueError with the reason otherwise."""
    field, eq, values = text.partition("=")
    parts = [v.strip() for v in values.split(",")]
    if not eq or not field.strip() or len(parts) != 2 or not all(parts):
        raise ValueError(f"expected FIELD=A,B (e.g. disclosure=disclosed,hidden), got {text!r}")
    if parts[0] == parts[1]:
        raise ValueError(f"A and B must differ, got {text!r}")
    return Comparison(field.strip(), parts[0], parts[1])


def excludes_zero(low: float | None, high: float | None, note: str | None) -> bool:
    """Whether an interval lies wholly above or below 0 (a zero-width one never does)."""
    if low is None or high is None or note is not None:
        return False
    return low > 0 or high < 0


@dataclass(frozen=True)
class Difference:
    """One cell of a comparison: mean over paired tasks of Pass@(K,T) under A minus under B."""

    comparison: Comparison
    k: int
    budget: Budget
    by: tuple[tuple[str, str | None], ...]  # the other --by fields
    diff: float | None
    ci_low: float | None
    ci_high: float | None
    a_value: float | None  # means over the same paired tasks
    b_value: float | None
    n_tasks: int  # tasks with at least K eligible episodes under both A and B
    n_tasks_unpaired: int  # tasks with at least K under only one of them
    ci_note: str | None = None
    n_episodes: int = 0  # eligible episodes of the paired tasks, under the value with fewer
    p_value: float | None = None  # bootstrap, two-sided, of "no difference"
    p_adjusted: float | None = None  # over the comparison's cells (`adjusted`)
    adjust: str = "none"

    @property
    def columns(self) -> tuple[tuple[str, str | None], ...]:
        """The leading columns of its text-table row: the other --by fields."""
        return self.by

    @property
    def excludes_zero(self) -> bool:
        return excludes_zero(self.ci_low, self.ci_high, self.ci_note)

    @property
    def few_tasks(self) -> bool:
        """Whether its interval rests on too few draws (stats.few_tasks)."""
        return self.diff is not None and few_tasks(self.n_tasks, self.n_episodes, self.k)

    @property
    def significant(self) -> bool:
        return significant(self)

    def as_json(self) -> dict[str, Any]:
        row: dict[str, Any] = {
            "field": self.comparison.field,
            "a": self.comparison.a,
            "b": self.comparison.b,
            "k": self.k,
        }
        if self.budget.kind == "tier":
            row["tier"] = self.budget.label
        else:
            row["turns"] = int(self.budget.value)
        row.update(
            diff=self.diff,
            ci_low=self.ci_low,
            ci_high=self.ci_high,
            a_value=self.a_value,
            b_value=self.b_value,
            n_tasks=self.n_tasks,
            n_tasks_unpaired=self.n_tasks_unpaired,
            n_episodes=self.n_episodes,
            by=dict(self.by),
            ci_note=self.ci_note,
            few_tasks=self.few_tasks,
            excludes_zero=self.excludes_zero,
            p_value=self.p_value,
            p_adjusted=self.p_adjusted,
            adjust=self.adjust,
            significant=self.significant,
        )
        return row


class _Cell(Protocol):
    @property
    def diff(self) -> float | None: ...
    @property
    def ci_low(self) -> float | None: ...
    @property
    def ci_high(self) -> float | None: ...
    @property
    def ci_note(self) -> str | None: ...
    @property
    def p_value(self) -> float | None: ...
    @property
    def p_adjusted(self) -> float | None: ...
    @property
    def adjust(self) -> str: ...


def significant(cell: _Cell) -> bool:
    """Whether a cell is starred: its interval excludes 0 and, under an adjustment, its
    adjusted p-value is below ALPHA too (so a star never sits on an interval holding 0). A
    zero-width interval never is (no evidence of anything)."""
    if cell.diff is None or not excludes_zero(cell.ci_low, cell.ci_high, cell.ci_note):
        return False
    return cell.adjust == "none" or cell.p_adjusted is None or cell.p_adjusted < ALPHA


D = TypeVar("D", bound=_Cell)


def adjusted(cells: Sequence[D], method: str) -> list[D]:
    """A comparison's cells, each with its p-value adjusted by `method` (`stats.ADJUSTMENTS`)
    over the cells with a paired task; the empty ones (none) are kept as they are."""
    if method not in ADJUSTMENTS:
        raise ValueError(f"unknown adjustment {method!r}")
    tested = [i for i, c in enumerate(cells) if c.diff is not None]
    raw = [cells[i].p_value for i in tested]
    ps = adjust_p([1.0 if p is None else p for p in raw], method)
    by_index = dict(zip(tested, ps, strict=True))
    # (every cell type is a frozen dataclass; the Protocol cannot say so to the type checker)
    return [cast(D, replace(cast(Any, c), p_adjusted=by_index.get(i), adjust=method))
            for i, c in enumerate(cells)]


def compute_differences(
    con: Any,
    comparison: Comparison,
    ks: Sequence[int],
    budgets: Sequence[Budget],
    by: Sequence[str] = (),
    resamples: int = 1000,
    seed: int = 0,
) -> list[Difference]:
    """Every (other slice, T, K) difference, ordered by slice, then T, then K as given."""
    others = [f for f in by if f != comparison.field]
    groups = task_counts(con, budgets, [*others, comparison.field])
    slices = sorted({key[:-1] for key, _ in groups}, key=slice_order)
    out = []
    for key in slices:
        for idx, budget in enumerate(budgets):
            a = {t: (n, c) for t, n, c in groups.get(((*key, comparison.a), idx), [])}
            b = {t: (n, c) for t, n, c in groups.get(((*key, comparison.b), idx), [])}
            for k in ks:
                out.append(
                    _difference(
                        comparison, k, budget, tuple(zip(others, key, strict=True)), a, b,
                        resamples, seed,
                    )
                )  # fmt: skip
    return out


def _difference(
    comparison: Comparison,
    k: int,
    budget: Budget,
    by: tuple[tuple[str, str | None], ...],
    a: dict[str, tuple[int, int]],
    b: dict[str, tuple[int, int]],
    resamples: int,
    seed: int,
) -> Difference:
    return Difference(comparison=comparison, k=k, budget=budget, by=by,
                      **paired(a, b, k, resamples, seed))  # fmt: skip


def paired(
    a: Mapping[str, tuple[int, int]],
    b: Mapping[str, tuple[int, int]],
    k: int,
    resamples: int,
    seed: int,
) -> dict[str, Any]:
    """A difference cell's numbers from each task's (n eligible, c succeeded) under A and
    under B: the mean over the tasks with n >= K under both of Pass@K under A minus under B,
    its paired bootstrap CI, the two means over those tasks, and the counts."""
    enough_a = {t for t, (n, _) in a.items() if n >= k}
    enough_b = {t for t, (n, _) in b.items() if n >= k}
    both = sorted(enough_a & enough_b)  # task_id order: the bootstrap resamples by position
    a_values = [pass_at_k(*a[t], k) for t in both]
    b_values = [pass_at_k(*b[t], k) for t in both]
    diffs = [x - y for x, y in zip(a_values, b_values, strict=True)]
    diff = low = high = a_mean = b_mean = p = None
    note = None
    if diffs:
        diff = sum(diffs) / len(diffs)
        a_mean, b_mean = sum(a_values) / len(both), sum(b_values) / len(both)
        low, high = bootstrap_ci(diffs, resamples=resamples, seed=seed)
        note = zero_width_note(diffs, low, high, difference=True)
        p = bootstrap_p(diffs, resamples=resamples, seed=seed)
    return {
        "diff": diff,
        "ci_low": low,
        "ci_high": high,
        "a_value": a_mean,
        "b_value": b_mean,
        "n_tasks": len(both),
        "n_tasks_unpaired": len(enough_a ^ enough_b),
        "ci_note": note,
        "n_episodes": min(sum(a[t][0] for t in both), sum(b[t][0] for t in both)),
        "p_value": p,
    }


class DifferenceRow(Protocol):
    """What the text table reads of a difference (`Difference`, or one along another axis)."""

    @property
    def comparison(self) -> Comparison: ...
    @property
    def k(self) -> int: ...
    @property
    def budget(self) -> Labelled: ...
    @property
    def columns(self) -> tuple[tuple[str, str | None], ...]: ...
    @property
    def diff(self) -> float | None: ...
    @property
    def ci_low(self) -> float | None: ...
    @property
    def ci_high(self) -> float | None: ...
    @property
    def a_value(self) -> float | None: ...
    @property
    def b_value(self) -> float | None: ...
    @property
    def n_tasks(self) -> int: ...
    @property
    def ci_note(self) -> str | None: ...
    @property
    def excludes_zero(self) -> bool: ...
    @property
    def few_tasks(self) -> bool: ...
    @property
    def significant(self) -> bool: ...
    @property
    def p_value(self) -> float | None: ...
    @property
    def p_adjusted(self) -> float | None: ...
    @property
    def adjust(self) -> str: ...


def format_differences(
    diffs: Sequence[DifferenceRow],
    resamples: int,
    seed: int,
    *,
    measure: str = "Pass@(K,T)",
    column: str = "tier/T",
    letter: str = "T",
    comparison: Comparison | None = None,
) -> str:
    """A terminal table per comparison: one row per slice, T and K with a paired task
    (`measure`, `column` and `letter` name the budget for differences along another axis);
    the cells with none are counted in a note, not shown."""
    shown = [d for d in diffs if d.diff is not None]
    c = shown[0].comparison if shown else comparison if comparison is not None else (
        diffs[0].comparison if diffs else None)
    if c is None:
        return ""
    title = (f"Paired differences, {c.label} [95% CI: {resamples} paired bootstrap resamples "
             f"over tasks, seed {seed}]")
    dropped = len(diffs) - len(shown)
    if not shown:
        return f"{title}\n\nno cell has a task with K eligible episodes under both {c.a} and " \
               f"{c.b}\n"
    method = shown[0].adjust
    fields = [name for name, _ in shown[0].columns]
    p_head = "p" if method == "none" else f"p ({method})"
    header = [*fields, column, "K", "tasks", c.a, c.b, f"{c.a} − {c.b} [95% CI]", p_head, ""]
    body = []
    few = zero = False
    for d in shown:
        assert d.diff is not None and d.a_value is not None and d.b_value is not None
        line = [("-" if v is None else v) for _, v in d.columns]
        line += [d.budget.label, str(d.k), f"{d.n_tasks:,}"]
        if d.ci_note is not None:
            interval = f"[{d.ci_note}]"
            zero = True
        else:
            interval = f"[{100 * (d.ci_low or 0):+.1f}, {100 * (d.ci_high or 0):+.1f}]"
        p = d.p_adjusted if method != "none" else d.p_value
        line += [f"{100 * d.a_value:.1f}", f"{100 * d.b_value:.1f}",
                 f"{100 * d.diff:+.1f} {interval}", _p_text(p, resamples)]  # fmt: skip
        flags = ("*" if d.significant else "") + ("†" if d.few_tasks else "")
        few |= d.few_tasks
        line.append(flags)
        body.append(line)
    left = len(fields) + 1
    widths = [max(len(str(r[i])) for r in [header, *body]) for i in range(len(header))]

    def fmt(row: list[str]) -> str:
        parts = [
            str(v).ljust(w) if i < left or i == len(row) - 1 else str(v).rjust(w)
            for i, (v, w) in enumerate(zip(row, widths, strict=True))
        ]
        return "  ".join(parts).rstrip()

    n = len(shown)
    if method == "none":
        star = (f"*: the interval excludes 0; no adjustment for reading {n} cells together "
                "(--adjust holm or bh for one).")
    else:
        star = (f"*: p below {ALPHA} after {ADJUSTMENTS[method]} adjustment over the {n} "
                "cells shown; the intervals are per cell, unadjusted.")
    notes = [
        f"{measure} in % on the tasks where both {c.a} and {c.b} have at least K eligible "
        f"episodes at {letter}; the difference in points, per task, averaged.",
        star,
        f"p: two-sided, from the bootstrap resamples (resolution 1/{resamples}).",
        "tasks: the paired tasks; a task with K eligible episodes under only one value is "
        "left out.",
    ]
    if dropped:
        notes.append(f"{dropped} cell(s) with no paired task are not shown.")
    if few:
        notes.append(f"†: {FEW_TASKS_NOTE} (paired): the interval rests on few draws.")
    if zero:
        notes.append("zero width: every resample of the tasks gives the same mean difference; "
                     "that is no evidence of certainty.")  # fmt: skip
    out = [title, "", fmt(header), *(fmt(r) for r in body), "", *notes]
    return "\n".join(out) + "\n"


def _p_text(p: float | None, resamples: int) -> str:
    if p is None:
        return "—"
    if p == 0:
        return f"<{1 / resamples:.2g}"
    return f"{p:.3f}" if p >= 0.001 else f"{p:.1e}"
