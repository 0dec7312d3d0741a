"""Paired differences of Pass@(K,T) between two values of a field, per task, with bootstrap CIs.

`--compare disclosure=disclosed,hidden` (or `model=a,b`, or a tag) asks, per slice of the
other `--by` fields, T and K: on the tasks where both values have at least K eligible
episodes, how much higher is Pass@(K,T) under A than under B? Each such task gives one
difference of its two per-task estimates; the mean difference is the answer, and its
interval comes from resampling those tasks (a paired bootstrap: a task's two estimates stay
together, so what the tasks share — their difficulty — cancels out).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from budgetproxy.analysis.passk import pass_at_k
from budgetproxy.analysis.stats import FEW_TASKS_NOTE, bootstrap_ci, few_tasks, zero_width_note
from budgetproxy.analysis.table import Budget, Labelled, slice_order, task_counts


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
        )
        return row


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
    diff = low = high = a_mean = b_mean = None
    note = None
    if diffs:
        diff = sum(diffs) / len(diffs)
        a_mean, b_mean = sum(a_values) / len(both), sum(b_values) / len(both)
        low, high = bootstrap_ci(diffs, resamples=resamples, seed=seed)
        note = zero_width_note(diffs, low, high, difference=True)
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


def format_differences(
    diffs: Sequence[DifferenceRow],
    resamples: int,
    seed: int,
    *,
    measure: str = "Pass@(K,T)",
    column: str = "tier/T",
    letter: str = "T",
) -> str:
    """A terminal table per comparison: one row per slice, T and K (`measure`, `column` and
    `letter` name the budget for differences along another axis)."""
    if not diffs:
        return ""
    c = diffs[0].comparison
    fields = [name for name, _ in diffs[0].columns]
    header = [*fields, column, "K", "tasks", c.a, c.b, f"{c.a} − {c.b} [95% CI]", ""]
    body = []
    few = zero = False
    for d in diffs:
        line = [("-" if v is None else v) for _, v in d.columns]
        line += [d.budget.label, str(d.k), f"{d.n_tasks:,}"]
        if d.diff is None:
            line += ["—", "—", "—", ""]
        else:
            assert d.a_value is not None and d.b_value is not None
            if d.ci_note is not None:
                interval = f"[{d.ci_note}]"
                zero = True
            else:
                interval = f"[{100 * (d.ci_low or 0):+.1f}, {100 * (d.ci_high or 0):+.1f}]"
            line += [f"{100 * d.a_value:.1f}", f"{100 * d.b_value:.1f}",
                     f"{100 * d.diff:+.1f} {interval}"]  # fmt: skip
            flags = ("*" if d.excludes_zero else "") + ("†" if d.few_tasks else "")
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

    notes = [
        f"{measure} in % on the tasks where both {c.a} and {c.b} have at least K eligible "
        f"episodes at {letter}; the difference in points, per task, averaged.",
        "*: the interval excludes 0.",
        "tasks: the paired tasks; a task with K eligible episodes under only one value is "
        "left out.",
    ]
    if few:
        notes.append(f"†: {FEW_TASKS_NOTE} (paired): the interval rests on few draws.")
    if zero:
        notes.append("zero width: every resample of the tasks gives the same mean difference; "
                     "that is no evidence of certainty.")  # fmt: skip
    out = [
        f"Paired differences, {c.label} [95% CI: {resamples} paired bootstrap resamples over "
        f"tasks, seed {seed}]",
        "",
        fmt(header),
        *(fmt(r) for r in body),
        "",
        *notes,
    ]
    return "\n".join(out) + "\n"
