"""The report's paired-difference charts: one forest chart per comparison and K."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

from budgetproxy.analysis.compare import Difference
from budgetproxy.analysis.stats import FEW_TASKS_NOTE
from budgetproxy.analysis.svg import ForestRow, forest_chart


def figure(svg: str, caption: str) -> str:
    """A chart with its caption, as the report lays them out."""
    return f"<figure>{svg}<figcaption>{caption}</figcaption></figure>"


def difference_charts(differences: Sequence[Sequence[Difference]]) -> list[str]:
    """Per comparison and K: each slice and T's paired difference A − B with its interval. The
    charts of one comparison share one x scale, so their K can be compared by eye."""
    charts = []
    for diffs in differences:
        if not diffs:
            continue
        c = diffs[0].comparison
        per_k: dict[int, list[ForestRow]] = {}
        for k in dict.fromkeys(d.k for d in diffs):
            rows = per_k[k] = []
            for d in (d for d in diffs if d.k == k and d.diff is not None):
                name = " · ".join("-" if v is None else v for _, v in d.by)
                note = f"{d.n_tasks} tasks" + (" †" if d.few_tasks else "")
                if d.ci_note:
                    note += f", {d.ci_note}"
                label = f"{name} · {d.budget.label}" if name else d.budget.label
                rows.append(
                    ForestRow(label, d.diff, d.ci_low, d.ci_high, note, d.excludes_zero)
                )
        every = [r for rows in per_k.values() for r in rows]
        for k, rows in per_k.items():
            svg = forest_chart(
                f"Pass@({k},T): {c.a} − {c.b}",
                rows,
                x_title=f"difference in points, {c.a} − {c.b} (per task, paired)",
                shared=every,
            )
            charts.append(figure(svg, (
                f"Mean over the tasks where both {escape(c.a)} and {escape(c.b)} have at least "
                f"{k} eligible episodes at T of the per-task difference, with a 95% paired "
                f"bootstrap interval over those tasks. Blue: the interval excludes 0. †: "
                f"{FEW_TASKS_NOTE}. Slices and T with no such task are not drawn. Every "
                f"chart of {escape(c.a)} − {escape(c.b)} has the same x scale."
            )))  # fmt: skip
    return charts
