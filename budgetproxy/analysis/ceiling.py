"""The ceiling per budget: the share of tasks that can be solved within T at all, and the
headroom between it and Pass@(K,T) (`analyze --ceiling`).

A task's minimum is the fewest turns it can be solved in: from a tasks file (`--tasks`), else
the `min_turns` its episodes were started with (`X-Episode-Min-Turns`), else the shortest
success observed in the logs across every arm, which is an upper bound on the true minimum
(so an observed ceiling can only be too low, and a task never solved counts as not solvable).
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from budgetproxy.analysis.db import InputError
from budgetproxy.analysis.passk import pass_at_k, tier_to_turns
from budgetproxy.analysis.stats import bootstrap_ci, zero_width_note
from budgetproxy.analysis.svg import Series, line_chart
from budgetproxy.analysis.table import Budget, Cell, TaskCounts, task_counts

SOURCES = ("min_turns", "observed")


@dataclass(frozen=True)
class Minimum:
    """A task's fewest turns to success (None: never solved and none stated), and whence."""

    turns: int | None
    source: str  # "min_turns" | "observed"


@dataclass(frozen=True)
class Ceiling:
    """One cell's ceiling over the cell's own tasks, and its headroom over Pass@(K,T)."""

    value: float | None
    ci_low: float | None
    ci_high: float | None
    source: str | None  # "observed" when any of the cell's tasks has only an observed minimum
    n_observed: int  # tasks of the cell whose minimum is the shortest success observed
    headroom: float | None
    headroom_ci_low: float | None
    headroom_ci_high: float | None
    ci_note: str | None = None
    headroom_note: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "ceiling": self.value, "ceiling_ci_low": self.ci_low,
            "ceiling_ci_high": self.ci_high, "ceiling_source": self.source,
            "ceiling_tasks_observed": self.n_observed, "ceiling_ci_note": self.ci_note,
            "headroom": self.headroom, "headroom_ci_low": self.headroom_ci_low,
            "headroom_ci_high": self.headroom_ci_high, "headroom_ci_note": self.headroom_note,
        }  # fmt: skip


def read_tasks_file(path: Path) -> dict[str, int]:
    """task_id → min_turns from a JSONL file (one object a line) or a CSV file with a header
    naming task_id and min_turns. A bad line exits 2 naming it."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"--tasks: cannot read {path}: {exc}", 2) from None
    rows: list[tuple[int, Any]] = []
    if path.suffix.lower() == ".csv":
        reader = csv.DictReader(text.splitlines())
        if not reader.fieldnames or not {"task_id", "min_turns"} <= set(reader.fieldnames):
            raise InputError(f"--tasks: {path}: the CSV header must name task_id and min_turns", 2)
        rows = [(i, row) for i, row in enumerate(reader, 2)]
    else:
        for i, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                rows.append((i, json.loads(line)))
            except ValueError:
                raise InputError(f"--tasks: {path} line {i}: not JSON", 2) from None
    out: dict[str, int] = {}
    for i, row in rows:
        task, turns = (row.get("task_id"), row.get("min_turns")) if isinstance(row, dict) \
            else (None, None)
        try:
            value = int(str(turns).strip())
        except ValueError:
            value = 0
        if not isinstance(task, str) or not task or value < 1:
            raise InputError(f"--tasks: {path} line {i}: expected a task_id and a min_turns "
                             f"of at least 1, got {row!r}"[:200], 2)
        out[task] = min(value, out.get(task, value))
    return out


def task_minima(con: Any, stated: Mapping[str, int] | None = None) -> dict[str, Minimum]:
    """Every task's minimum: the tasks file, else the episodes' min_turns (the smallest
    stated), else the shortest success of any of its episodes (None when none succeeded)."""
    recorded = dict(con.execute(
        "SELECT task_id, min(min_turns) FROM episodes WHERE task_id IS NOT NULL "
        "AND min_turns IS NOT NULL GROUP BY task_id").fetchall())
    observed = dict(con.execute(
        "SELECT task_id, min(success_turn) FROM episodes WHERE task_id IS NOT NULL AND success "
        "AND end_reason <> 'abandoned' GROUP BY task_id").fetchall())
    tasks = [r[0] for r in con.execute(
        "SELECT DISTINCT task_id FROM episodes WHERE task_id IS NOT NULL").fetchall()]
    out = {}
    for task in tasks:
        given = (stated or {}).get(task, recorded.get(task))
        if given is not None:
            out[task] = Minimum(int(given), "min_turns")
        else:
            seen = observed.get(task)
            out[task] = Minimum(None if seen is None else int(seen), "observed")
    return out


def contradicted(con: Any, minima: Mapping[str, Minimum]) -> list[tuple[str, int, int]]:
    """(task, stated minimum, an earlier success): stated minima the logs disprove."""
    rows = con.execute(
        "SELECT task_id, min(success_turn) FROM episodes WHERE task_id IS NOT NULL AND success "
        "AND end_reason <> 'abandoned' GROUP BY task_id ORDER BY task_id").fetchall()
    out = []
    for task, seen in rows:
        m = minima.get(task)
        if m is not None and m.source == "min_turns" and m.turns is not None and seen < m.turns:
            out.append((str(task), m.turns, int(seen)))
    return out


def _task_turns(con: Any, budgets: Sequence[Budget]) -> dict[tuple[int, str], int]:
    """(budget index, task) → T: a tier resolved on the task's max_turns (the largest T when
    its episodes name several)."""
    rows = con.execute("SELECT DISTINCT task_id, max_turns FROM episodes "
                       "WHERE task_id IS NOT NULL AND max_turns IS NOT NULL").fetchall()
    out: dict[tuple[int, str], int] = {}
    for idx, budget in enumerate(budgets):
        if budget.kind != "tier":
            continue
        for task, max_turns in rows:
            t = tier_to_turns(budget.value, int(max_turns))
            out[(idx, str(task))] = max(t, out.get((idx, str(task)), t))
    return out


def compute_ceilings(
    con: Any,
    cells: Sequence[Cell],
    budgets: Sequence[Budget],
    by: Sequence[str],
    minima: Mapping[str, Minimum],
    resamples: int = 1000,
    seed: int = 0,
) -> list[Ceiling]:
    """One Ceiling per cell, over the tasks its value averages (n ≥ K eligible at T), in the
    cells' order. Intervals: the same expanded bootstrap over tasks (and seed) as the cells';
    the headroom's resamples each task's (solvable, estimate) pair together."""
    groups: TaskCounts = task_counts(con, budgets, by)
    turns = _task_turns(con, budgets)
    out = []
    for cell in cells:
        idx = budgets.index(cell.budget)
        key = tuple(v for _, v in cell.by)
        used = [(task, n, c) for task, n, c in groups.get((key, idx), []) if n >= cell.k]
        out.append(_ceiling(cell, idx, used, turns, minima, resamples, seed))
    return out


def _ceiling(
    cell: Cell, idx: int, used: Sequence[tuple[str, int, int]],
    turns: Mapping[tuple[int, str], int], minima: Mapping[str, Minimum],
    resamples: int, seed: int,
) -> Ceiling:
    if not used:
        return Ceiling(None, None, None, None, 0, None, None, None)
    solvable, gaps, observed = [], [], 0
    for task, n, c in used:
        t = int(cell.budget.value) if cell.budget.kind == "turns" else turns[(idx, task)]
        m = minima.get(task, Minimum(None, "observed"))
        observed += m.source == "observed"
        ok = 1.0 if m.turns is not None and m.turns <= t else 0.0
        solvable.append(ok)
        gaps.append(ok - pass_at_k(n, c, cell.k))
    low, high = bootstrap_ci(solvable, resamples=resamples, seed=seed)
    h_low, h_high = bootstrap_ci(gaps, resamples=resamples, seed=seed)
    return Ceiling(
        value=sum(solvable) / len(solvable), ci_low=low, ci_high=high,
        source="observed" if observed else "min_turns", n_observed=observed,
        headroom=math.fsum(gaps) / len(gaps), headroom_ci_low=h_low, headroom_ci_high=h_high,
        ci_note=zero_width_note(solvable, low, high),
        headroom_note=zero_width_note(gaps, h_low, h_high, difference=True),
    )  # fmt: skip


def format_ceilings(cells: Sequence[Cell], ceilings: Sequence[Ceiling]) -> str:
    """A terminal table: per slice, T and K, Pass@(K,T) beside the ceiling and the headroom,
    each with its 95% interval."""
    fields = [name for name, _ in cells[0].by] if cells else []
    header = [*fields, "tier/T", "K", "Pass@(K,T)", "ceiling", "headroom", "source"]
    body = []
    for cell, ceil in zip(cells, ceilings, strict=True):
        if cell.value is None or ceil.value is None:
            continue
        body.append([
            *(("-" if v is None else v) for _, v in cell.by), cell.budget.label, str(cell.k),
            _pct(cell.value, cell.ci_low, cell.ci_high, cell.ci_note),
            _pct(ceil.value, ceil.ci_low, ceil.ci_high, ceil.ci_note),
            _pct(ceil.headroom, ceil.headroom_ci_low, ceil.headroom_ci_high, ceil.headroom_note),
            f"observed ({ceil.n_observed})" if ceil.source == "observed" else str(ceil.source),
        ])  # fmt: skip
    if not body:
        return "no ceiling cells (no task has K eligible episodes at any T)\n"
    widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]
    left = len(fields) + 1
    lines = [
        "The ceiling per budget: share of the cell's tasks solvable within T at all, beside "
        "Pass@(K,T); headroom = ceiling − Pass@(K,T) (in points) [95% CI over tasks]",
        "",
        *("  ".join(c.ljust(w) if i < left or i == len(r) - 1 else c.rjust(w)
                    for i, (c, w) in enumerate(zip(r, widths, strict=True))).rstrip()
          for r in [header, *body]),
        "",
        "source: min_turns = every task's minimum was stated (X-Episode-Min-Turns, min_turns "
        "or --tasks); observed (n) = n tasks had none, and their minimum is the shortest "
        "success in the logs (a task never solved counts as not solvable), so the ceiling can "
        "only be too low.",
    ]
    return "\n".join(lines) + "\n"


def _pct(value: float | None, low: float | None, high: float | None, note: str | None) -> str:
    if value is None:
        return "—"
    if note is not None:
        return f"{100 * value:.1f} [{note}]"
    return f"{100 * value:.1f} [{100 * (low or 0):.1f}, {100 * (high or 0):.1f}]"


def ceiling_charts(cells: Sequence[Cell], ceilings: Sequence[Ceiling]) -> str:
    """The report's section: per slice, Pass@(K,T) at the smallest K beside the ceiling, over
    T, each with its 95% interval."""
    pairs = [(c, x) for c, x in zip(cells, ceilings, strict=True) if c.value is not None]
    if not pairs:
        return ""
    k = min(c.k for c, _ in pairs)
    charts = []
    for sl in dict.fromkeys(c.by for c, _ in pairs):
        mine = [(c, x) for c, x in pairs if c.by == sl and c.k == k]
        labels = [c.budget.label for c, _ in mine]
        series = [
            Series("ceiling", [x.value for _, x in mine], [x.ci_low for _, x in mine],
                   [x.ci_high for _, x in mine], color="#888888",
                   tips=[f"{x.source}, {c.n_tasks} tasks" for c, x in mine]),
            Series(f"Pass@({k},T)", [c.value for c, _ in mine], [c.ci_low for c, _ in mine],
                   [c.ci_high for c, _ in mine], color="#1f77b4",
                   tips=[f"headroom {100 * (x.headroom or 0):.1f} points" for _, x in mine]),
        ]
        name = " · ".join(f"{n}={'-' if v is None else v}" for n, v in sl)
        svg = line_chart(f"Ceiling and Pass@({k},T)" + (f" ({name})" if name else ""), labels,
                         series, x_title="turn budget T", y_title="share of tasks", y_max=1.0)
        charts.append(f"<figure>{svg}<figcaption>Bands: 95% bootstrap CI over tasks. The gap "
                      "is the headroom: tasks solvable within T that the policy does not "
                      "solve.</figcaption></figure>")
    return ("<h2>The ceiling per budget</h2><p class=muted>Share of tasks solvable within T at "
            "all (from each task's stated minimum, else the shortest success observed), beside "
            f"Pass@({k},T).</p><div class=charts>{''.join(charts)}</div>")
