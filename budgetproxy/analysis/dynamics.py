"""Training dynamics: Pass@(K,T) per checkpoint (`analyze --over FIELD`), in checkpoint order.

A checkpoint is a value of an episode field or tag (`step`, `model`, ...). Checkpoints are
ordered numerically when every value reads as a number, else by first appearance: the
earliest `started_at` among each value's episodes (then by value).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from html import escape
from typing import Any

from budgetproxy.analysis.svg import PALETTE, Series, line_chart
from budgetproxy.analysis.table import Cell, by_expression


@dataclass(frozen=True)
class Checkpoint:
    """One checkpoint's cells (their `by` without the --over field) and, per cell, the ceiling
    fields when --ceiling is asked for."""

    value: str
    cells: list[Cell]
    extra: list[dict[str, Any]]

    def as_json(self) -> dict[str, Any]:
        return {"value": self.value,
                "pass_at": [{**c.as_json(), **x} for c, x in zip(self.cells, self.extra,
                                                                  strict=True)]}


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def checkpoint_order(values: Sequence[str]) -> list[str]:
    """`values` (distinct, in order of first appearance) in checkpoint order: numerically
    when every one reads as a number (ties by text), else as given."""
    numbers = [_number(v) for v in values]
    if values and all(n is not None for n in numbers):
        return [v for _, v in sorted(zip(numbers, values, strict=True),
                                     key=lambda p: (p[0], p[1]))]
    return list(values)


def checkpoints(con: Any, field: str) -> tuple[list[str], int]:
    """The field's values in checkpoint order, and how many usable episodes have none."""
    expr = by_expression(field)
    rows = con.execute(
        f"SELECT {expr} AS v, min(started_at) AS first FROM episodes "
        f"WHERE task_id IS NOT NULL AND end_reason <> 'abandoned' AND {expr} IS NOT NULL "
        f"GROUP BY v ORDER BY first NULLS LAST, v").fetchall()
    (missing,) = con.execute(
        f"SELECT count(*) FROM episodes WHERE task_id IS NOT NULL AND end_reason <> 'abandoned' "
        f"AND {expr} IS NULL").fetchone()
    return checkpoint_order([str(r[0]) for r in rows]), int(missing)


def split_over(
    cells: Sequence[Cell], order: Sequence[str], extra: Sequence[dict[str, Any]] | None = None
) -> list[Checkpoint]:
    """Cells computed with the --over field first in `by`, one Checkpoint per value in
    `order` (cells of episodes without the field are left out)."""
    extras = list(extra) if extra is not None else [{} for _ in cells]
    found: dict[str, Checkpoint] = {}
    for cell, x in zip(cells, extras, strict=True):
        value = cell.by[0][1]
        if value is None:
            continue
        point = found.setdefault(value, Checkpoint(value, [], []))
        point.cells.append(replace(cell, by=cell.by[1:]))
        point.extra.append(x)
    return [found[v] for v in order if v in found]


def _k_shown(points: Sequence[Checkpoint]) -> int | None:
    ks = sorted({c.k for p in points for c in p.cells})
    return ks[0] if ks else None


def _slices(points: Sequence[Checkpoint]) -> list[tuple[tuple[str, str | None], ...]]:
    return list(dict.fromkeys(c.by for p in points for c in p.cells))


def _cell_text(cell: Cell | None) -> str:
    if cell is None or cell.value is None:
        return "—"
    if cell.ci_note is not None:
        text = f"{100 * cell.value:.1f} [{cell.ci_note}]"
    else:
        text = f"{100 * cell.value:.1f} [{100 * (cell.ci_low or 0):.1f}, " \
               f"{100 * (cell.ci_high or 0):.1f}]"
    return text + (" †" if cell.few_tasks else "")


def format_over(points: Sequence[Checkpoint], field: str, missing: int) -> str:
    """Per slice, a table of Pass@(K,T) at the smallest K: a row per checkpoint, a column per
    T, each with its 95% interval."""
    k = _k_shown(points)
    if k is None:
        return f"--over {field}: no episode has this field or tag\n"
    out = [f"Pass@({k},T) per checkpoint ({field}) in % [95% CI: bootstrap over tasks]; the "
           "--json output holds every K", ""]
    few = False
    for sl in _slices(points):
        labels = list(dict.fromkeys(c.budget.label for p in points for c in p.cells
                                    if c.by == sl))  # fmt: skip
        if sl:
            out.append(" · ".join(f"{n}={'-' if v is None else v}" for n, v in sl))
        rows = [[field, *labels]]
        for p in points:
            mine = {c.budget.label: c for c in p.cells if c.by == sl and c.k == k}
            few |= any(c.few_tasks for c in mine.values())
            rows.append([p.value, *(_cell_text(mine.get(b)) for b in labels)])
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        out += ["  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                          for i, (c, w) in enumerate(zip(r, widths, strict=True))).rstrip()
                for r in rows]  # fmt: skip
        out.append("")
    if few:
        out.append("†: fewer than 10 tasks, or under 2K eligible episodes a task on average: "
                   "the interval rests on few draws; read no trend from it.")
    if missing:
        out.append(f"{missing:,} episode(s) without {field} are in no checkpoint.")
    return "\n".join(out).rstrip("\n") + "\n"


def over_charts(points: Sequence[Checkpoint], field: str) -> str:
    """The report's section: per slice, Pass@(K,T) at the smallest K against the checkpoint,
    a line and 95% interval per T."""
    k = _k_shown(points)
    if k is None:
        return ""
    charts = []
    for sl in _slices(points):
        labels = list(dict.fromkeys(c.budget.label for p in points for c in p.cells
                                    if c.by == sl))  # fmt: skip
        series = []
        for i, label in enumerate(labels):
            row = [next((c for c in p.cells if c.by == sl and c.k == k
                         and c.budget.label == label), None) for p in points]
            series.append(Series(
                f"T = {label}", [None if c is None else c.value for c in row],
                [None if c is None else c.ci_low for c in row],
                [None if c is None else c.ci_high for c in row], color=PALETTE[i % len(PALETTE)],
                tips=[None if c is None else f"{c.n_tasks} tasks" + (", few" if c.few_tasks
                                                                     else "") for c in row]))
        name = " · ".join(f"{n}={'-' if v is None else v}" for n, v in sl)
        svg = line_chart(f"Pass@({k},T) per checkpoint" + (f" ({name})" if name else ""),
                         [p.value for p in points], series, x_title=f"checkpoint ({field})",
                         y_title=f"Pass@{k}", y_max=1.0, empty="no data")
        charts.append(f"<figure>{svg}<figcaption>Bands: 95% bootstrap CI over tasks. Hover a "
                      "point for its tasks; points marked few rest on fewer than 10 tasks."
                      "</figcaption></figure>")
    return (f"<h2>Training dynamics: Pass@({k},T) per {escape(field)}</h2><p class=muted>"
            "Checkpoints in order (numerically where every value is a number, else by first "
            "appearance); one line per budget T.</p>"
            f"<div class=charts>{''.join(charts)}</div>")
