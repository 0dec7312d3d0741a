"""Pass@(K,T) cells from the `episodes` table: eligibility, per-task estimates, bootstrap CIs."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Protocol

from budgetproxy.analysis.db import sql_str
from budgetproxy.analysis.passk import pass_at_k, tier_to_turns
from budgetproxy.analysis.stats import (
    FEW_TASKS_NOTE,
    PILED_NOTE,
    bootstrap_ci,
    few_tasks,
    piled,
    zero_width_note,
)

# Episode columns `--by` can name; any other name is looked up in the episode's tags.
EPISODE_COLUMNS = (
    "disclosure", "model", "group", "task_id", "tier", "max_turns", "budget",
    "announced_budget", "end_reason",
)  # fmt: skip


@dataclass(frozen=True)
class Budget:
    """One T column: a tier (percent of each task's max_turns) or an absolute number of turns."""

    kind: str  # "tier" | "turns"
    value: Fraction

    @property
    def label(self) -> str:
        if self.kind == "turns":
            return str(int(self.value))
        text = str(self.value) if self.value.denominator == 1 else f"{float(self.value):g}"
        return f"{text}%"


@dataclass(frozen=True)
class Cell:
    """Pass@(K,T) of one slice: the mean over tasks with at least K eligible episodes."""

    k: int
    budget: Budget
    by: tuple[tuple[str, str | None], ...]
    value: float | None
    ci_low: float | None
    ci_high: float | None
    n_tasks: int
    n_tasks_left_out: int
    n_episodes: int
    # tasks with ≥ 1 eligible episode at T and their eligible episodes, whatever K
    tasks_eligible: int
    episodes_eligible: int
    # why the interval has zero width (one task, every task at 1, ...), None when it has width
    ci_note: str | None = None
    # most of its tasks' estimates at exactly 1 (or 0): the interval understates (stats.piled)
    piled: bool = False

    @property
    def columns(self) -> tuple[tuple[str, str | None], ...]:
        """The leading columns of its text-table row: the --by fields."""
        return self.by

    @property
    def few_tasks(self) -> bool:
        """Whether its interval rests on too few draws (stats.few_tasks)."""
        return self.value is not None and few_tasks(self.n_tasks, self.n_episodes, self.k)

    def as_json(self) -> dict[str, Any]:
        row: dict[str, Any] = {"k": self.k}
        if self.budget.kind == "tier":
            row["tier"] = self.budget.label
        else:
            row["turns"] = int(self.budget.value)
        row.update(
            value=self.value,
            ci_low=self.ci_low,
            ci_high=self.ci_high,
            n_tasks=self.n_tasks,
            n_tasks_left_out=self.n_tasks_left_out,
            n_episodes=self.n_episodes,
            by=dict(self.by),
            ci_note=self.ci_note,
            few_tasks=self.few_tasks,
            piled=self.piled,
        )
        return row


def by_expression(field: str) -> str:
    """SQL for the value of a `--by` field of an episode, as text."""
    if field in EPISODE_COLUMNS:
        return f'CAST("{field}" AS VARCHAR)'
    path = '$."' + field.replace('"', '\\"') + '"'
    return f"json_extract_string(tags, {sql_str(path)})"


# Per slice, budget and task: eligible episodes n and those that succeeded within T, c.
COUNTS_SQL = """
SELECT {by_cols}, s.idx, e.task_id,
    count(*) FILTER (WHERE {eligible}) AS n,
    count(*) FILTER (WHERE {eligible} AND e.success AND e.success_turn <= s.t) AS c
FROM episodes e JOIN budgets s ON s.max_turns IS NULL OR s.max_turns = e.max_turns
WHERE e.task_id IS NOT NULL AND e.end_reason <> 'abandoned'
GROUP BY ALL
"""

# The SQL form of passk.is_eligible.
ELIGIBLE_SQL = (
    "((e.disclosure = 'hidden' AND e.budget >= s.t) OR (e.disclosure = 'disclosed' "
    "AND e.budget = s.t AND coalesce(e.announced_budget, s.t) = s.t))"
)

SliceKey = tuple[str | None, ...]
# (slice, budget index) → [(task_id, n, c)], sorted by task_id
TaskCounts = dict[tuple[SliceKey, int], list[tuple[str, int, int]]]


def slice_order(key: SliceKey) -> list[tuple[bool, str]]:
    """Slices sort by their values, a missing value last."""
    return [(v is None, v or "") for v in key]


def task_counts(con: Any, budgets: Sequence[Budget], by: Sequence[str]) -> TaskCounts:
    """Eligible episodes n and successes c per slice, T and task. Each slice's tasks come
    sorted by task_id: the bootstrap resamples by position, so the order must not depend on
    how DuckDB happened to group the rows."""
    _create_budgets(con, budgets)
    by_cols = ", ".join(f"{by_expression(f)} AS by{i}" for i, f in enumerate(by)) or "NULL"
    rows = con.execute(COUNTS_SQL.format(by_cols=by_cols, eligible=ELIGIBLE_SQL)).fetchall()
    nb = max(1, len(by))
    groups: TaskCounts = defaultdict(list)
    for row in rows:
        key = tuple(row[:nb]) if by else ()
        groups[(key, int(row[nb]))].append((str(row[nb + 1]), int(row[nb + 2]), int(row[nb + 3])))
    for tasks in groups.values():
        tasks.sort()
    return dict(groups)


def compute_cells(
    con: Any,
    ks: Sequence[int],
    budgets: Sequence[Budget],
    by: Sequence[str] = (),
    resamples: int = 1000,
    seed: int = 0,
) -> list[Cell]:
    """Every (slice, T, K) cell, ordered by slice, then T as given, then K as given."""
    groups = task_counts(con, budgets, by)
    slices = sorted({key for key, _ in groups}, key=slice_order)
    cells = []
    for key in slices:
        for idx, budget in enumerate(budgets):
            tasks = [(n, c) for _, n, c in groups.get((key, idx), [])]
            for k in ks:
                cells.append(
                    _cell(k, budget, tuple(zip(by, key, strict=True)), tasks, resamples, seed)
                )
    return cells


def _cell(
    k: int,
    budget: Budget,
    by: tuple[tuple[str, str | None], ...],
    tasks: list[tuple[int, int]],
    resamples: int,
    seed: int,
) -> Cell:
    return Cell(k=k, budget=budget, by=by, **estimate(k, tasks, resamples, seed),
                piled=piled(task_values(k, tasks)))


def task_values(k: int, tasks: Sequence[tuple[int, int]]) -> list[float]:
    """The per-task Pass@K estimates of the tasks with at least K eligible episodes."""
    return [pass_at_k(n, c, k) for n, c in tasks if n >= k]


def estimate(k: int, tasks: Sequence[tuple[int, int]], resamples: int, seed: int) -> dict[str, Any]:
    """A cell's numbers from its tasks' (n eligible, c succeeded), in task_id order: the mean
    Pass@K over the tasks with n >= K, its bootstrap CI over them, and the counts."""
    used = [(n, c) for n, c in tasks if n >= k]
    values = task_values(k, tasks)
    value = ci_low = ci_high = None
    note = None
    if values:
        value = sum(values) / len(values)
        ci_low, ci_high = bootstrap_ci(values, resamples=resamples, seed=seed)
        note = zero_width_note(values, ci_low, ci_high)
    return {
        "value": value,
        "ci_low": ci_low,
        "ci_high": ci_high,
        "n_tasks": len(used),
        "n_tasks_left_out": len(tasks) - len(used),
        "n_episodes": sum(n for n, _ in used),
        "tasks_eligible": sum(1 for n, _ in tasks if n > 0),
        "episodes_eligible": sum(n for n, _ in tasks),
        "ci_note": note,
    }


def _create_budgets(con: Any, budgets: Sequence[Budget]) -> None:
    """Temp table budgets(idx, max_turns, t): tiers resolved per max_turns, exactly."""
    max_turns = [
        int(r[0])
        for r in con.execute(
            "SELECT DISTINCT max_turns FROM episodes WHERE max_turns IS NOT NULL"
        ).fetchall()
    ]
    rows: list[tuple[int, int | None, int]] = []
    for idx, budget in enumerate(budgets):
        if budget.kind == "turns":
            rows.append((idx, None, int(budget.value)))
        else:
            rows.extend((idx, m, tier_to_turns(budget.value, m)) for m in max_turns)
    con.execute("CREATE OR REPLACE TEMP TABLE budgets (idx INTEGER, max_turns BIGINT, t BIGINT)")
    if rows:
        con.executemany("INSERT INTO budgets VALUES (?, ?, ?)", rows)


class Labelled(Protocol):
    @property
    def label(self) -> str: ...


class TableCell(Protocol):
    """What the text table reads of a cell (`Cell` here, `AxisCell` along other axes)."""

    @property
    def k(self) -> int: ...
    @property
    def budget(self) -> Labelled: ...
    @property
    def columns(self) -> tuple[tuple[str, str | None], ...]: ...
    @property
    def value(self) -> float | None: ...
    @property
    def ci_low(self) -> float | None: ...
    @property
    def ci_high(self) -> float | None: ...
    @property
    def n_tasks(self) -> int: ...
    @property
    def tasks_eligible(self) -> int: ...
    @property
    def episodes_eligible(self) -> int: ...
    @property
    def ci_note(self) -> str | None: ...
    @property
    def few_tasks(self) -> bool: ...
    @property
    def piled(self) -> bool: ...


def format_cells(
    cells: Sequence[TableCell],
    resamples: int,
    seed: int,
    *,
    measure: str = "Pass@(K,T)",
    column: str | None = None,
    letter: str = "T",
) -> str:
    """A terminal table: one row per slice and T, one column per K, CIs in brackets.
    `measure`, `column` (the budget column's header) and `letter` name the budget for
    tables along another axis."""
    if not cells:
        return f"no {measure} cells\n"
    ks = list(dict.fromkeys(c.k for c in cells))
    fields = [name for name, _ in cells[0].columns]
    rows: dict[tuple[Any, ...], dict[int, TableCell]] = {}
    for cell in cells:
        rows.setdefault((cell.columns, cell.budget), {})[cell.k] = cell
    if column is None:
        column = "T" if all(getattr(b, "kind", "") == "turns" for _, b in rows) else "tier/T"
    header = [*fields, column, "tasks", "episodes", *(f"K={k}" for k in ks)]
    body = []
    left_out = missing = few = zero = pile = False
    for (by, budget), by_k in rows.items():
        first = next(iter(by_k.values()))
        line = [("-" if v is None else v) for _, v in by]
        line += [budget.label, f"{first.tasks_eligible:,}", f"{first.episodes_eligible:,}"]
        for k in ks:
            found = by_k.get(k)
            if found is None or found.value is None:
                line.append("—")
                missing = True
                continue
            text = f"{100 * found.value:.1f} " + interval_text(found)
            if found.n_tasks < found.tasks_eligible:
                text += f" ({found.n_tasks})"
                left_out = True
            if found.few_tasks:
                text += " †"
                few = True
            if found.piled:
                text += " ‡"
                pile = True
            zero |= found.ci_note is not None
            line.append(text)
        body.append(line)
    left = len(fields) + 1
    widths = [max(len(str(r[i])) for r in [header, *body]) for i in range(len(header))]

    def fmt(row: list[str]) -> str:
        parts = [
            str(v).ljust(w) if i < left else str(v).rjust(w)
            for i, (v, w) in enumerate(zip(row, widths, strict=True))
        ]
        return "  ".join(parts).rstrip()

    out = [
        f"{measure} in % (mean over tasks) [95% CI: {resamples} bootstrap resamples over "
        f"tasks, seed {seed}]",
        "",
        fmt(header),
        *(fmt(r) for r in body),
        "",
        *table_notes(left_out, missing, few, zero, letter, piled=pile),
    ]
    return "\n".join(out) + "\n"


def interval_text(cell: TableCell) -> str:
    """The interval as "[low, high]" in %, or the reason it has zero width."""
    if cell.ci_note is not None:
        return f"[{cell.ci_note}]"
    return f"[{100 * (cell.ci_low or 0):.1f}, {100 * (cell.ci_high or 0):.1f}]"


def table_notes(
    left_out: bool, missing: bool, few: bool = False, zero: bool = False, letter: str = "T",
    *, piled: bool = False,
) -> list[str]:
    """The legend under a Pass@(K,T) table: why a K cell can count fewer tasks than `tasks`."""
    notes = [
        f"tasks, episodes: tasks with at least one eligible episode at {letter}, and those "
        "episodes (whatever K).",
        f"K=k: the mean over only the tasks with at least k eligible episodes at {letter}.",
    ]
    if left_out:
        notes.append("(n): n of the row's tasks have at least k eligible episodes; the rest are "
                     "left out of that cell.")  # fmt: skip
    if missing:
        notes.append(f"—: none of the row's tasks has k eligible episodes at {letter}, so the "
                     "cell is empty; the tasks column still counts them.")  # fmt: skip
    if few:
        notes.append(f"†: {FEW_TASKS_NOTE}: the interval rests on few draws.")
    if piled:
        notes.append(f"‡: {PILED_NOTE}.")
    if zero:
        notes.append("zero width: every resample of the tasks gives the same mean (one task, "
                     "or all tasks alike); that is no evidence of certainty.")  # fmt: skip
    return notes
