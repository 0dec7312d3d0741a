"""The HTML report: one self-contained page of Pass@T curves, tier and turn charts."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from html import escape
from typing import Any

from budgetproxy.analysis.svg import Series, bar_chart, line_chart
from budgetproxy.analysis.table import Cell, by_expression

STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; color: #222; margin: 24px auto; max-width: 1120px;
       padding: 0 16px; }
h1 { font-size: 22px; } h2 { font-size: 17px; margin-top: 32px; border-bottom: 1px solid #ddd; }
.charts { display: flex; flex-wrap: wrap; gap: 12px; }
table { border-collapse: collapse; font-variant-numeric: tabular-nums; }
th, td { padding: 3px 10px; border-bottom: 1px solid #eee; text-align: right; }
th:first-child, td:first-child { text-align: left; }
.muted { color: #666; } pre { background: #f6f6f6; padding: 8px; white-space: pre-wrap; }
"""

# Per slice and budget tier (budget / max_turns to the nearest 5%, as the proxy labels it):
# finished episodes, successes and exhausted ones.
TIERS_SQL = """
SELECT {slice} AS slice,
    CASE WHEN max_turns IS NULL THEN NULL
         ELSE 5 * ((40 * budget + max_turns) // (2 * max_turns)) END AS tier,
    count(*), count(*) FILTER (WHERE success), count(*) FILTER (WHERE exhausted)
FROM episodes WHERE end_reason <> 'abandoned' GROUP BY ALL
"""

TURNS_SQL = """
SELECT {slice} AS slice, turns_used, count(*) FROM episodes
WHERE end_reason <> 'abandoned' GROUP BY ALL
"""


def slice_sql(by: Sequence[str]) -> str:
    """SQL naming an episode's slice, e.g. "hidden · qwen3-4b"."""
    parts = [f"coalesce({by_expression(f)}, '-')" for f in by]
    return " || ' · ' || ".join(parts) if parts else "'all'"


def _slice_name(cell: Cell) -> str:
    return " · ".join("-" if v is None else v for _, v in cell.by) or "all"


def _pct(v: float | None) -> str:
    return "—" if v is None else f"{100 * v:.1f}"


def pass_curves(cells: Sequence[Cell]) -> list[str]:
    """One chart per K (and per kind of T): Pass@(K,T) over T, a line and CI band per slice."""
    charts = []
    for kind, x_title in (
        ("tier", "turn budget T (% of the task's max_turns)"),
        ("turns", "turn budget T (turns)"),
    ):
        mine = [c for c in cells if c.budget.kind == kind]
        budgets = list(dict.fromkeys(c.budget for c in mine))
        for k in dict.fromkeys(c.k for c in mine):
            series = []
            for name in dict.fromkeys(_slice_name(c) for c in mine):
                row = {c.budget: c for c in mine if c.k == k and _slice_name(c) == name}
                series.append(
                    Series(
                        name,
                        [row[b].value if b in row else None for b in budgets],
                        [row[b].ci_low if b in row else None for b in budgets],
                        [row[b].ci_high if b in row else None for b in budgets],
                    )
                )
            charts.append(
                line_chart(
                    f"Pass@({k},T)",
                    [b.label for b in budgets],
                    series,
                    x_title=x_title,
                    y_title=f"Pass@{k}",
                    y_max=1.0,
                )
            )
    return charts


def _pass_td(cell: Cell | None) -> str:
    if cell is None or cell.value is None:
        return "<td>—</td>"
    return (
        f"<td>{_pct(cell.value)} <span class=muted>[{_pct(cell.ci_low)}, "
        f"{_pct(cell.ci_high)}] n={cell.n_tasks}</span></td>"
    )


def pass_table(cells: Sequence[Cell]) -> str:
    ks = list(dict.fromkeys(c.k for c in cells))
    rows: dict[tuple[str, str], dict[int, Cell]] = {}
    for c in cells:
        rows.setdefault((_slice_name(c), c.budget.label), {})[c.k] = c
    head = "".join(f"<th>K={k}</th>" for k in ks)
    body = []
    for (name, label), by_k in rows.items():
        tds = "".join(_pass_td(by_k.get(k)) for k in ks)
        body.append(f"<tr><td>{escape(name)}</td><td>{escape(label)}</td>{tds}</tr>")
    return (
        f"<table><tr><th>slice</th><th>T</th>{head}</tr>{''.join(body)}</table>"
        "<p class=muted>Pass@(K,T) in %, [95% bootstrap CI], n = tasks in the cell.</p>"
    )


def tier_charts(con: Any, by: Sequence[str]) -> list[str]:
    rows = con.execute(TIERS_SQL.format(slice=slice_sql(by))).fetchall()
    slices = sorted({r[0] for r in rows})
    tiers = sorted({r[1] for r in rows if r[1] is not None})
    stats = {(r[0], r[1]): r[2:] for r in rows}
    labels = [f"{t}%" for t in tiers]
    charts = []
    for title, col in (("Success by budget tier", 1), ("Exhaustion by budget tier", 2)):
        series = [
            Series(
                s,
                [stats[(s, t)][col] / stats[(s, t)][0] if (s, t) in stats else None for t in tiers],
            )
            for s in slices
        ]
        charts.append(
            bar_chart(
                title,
                labels,
                series,
                x_title="budget / max_turns",
                y_title="share of finished episodes",
                y_max=1.0,
            )
        )
    return charts


def turns_chart(con: Any, by: Sequence[str]) -> str:
    rows = con.execute(TURNS_SQL.format(slice=slice_sql(by))).fetchall()
    slices = sorted({r[0] for r in rows})
    top = max((int(r[1]) for r in rows if r[1] is not None), default=1)
    counts = {(r[0], r[1]): r[2] for r in rows}
    totals = {s: sum(n for (name, _), n in counts.items() if name == s) for s in slices}
    series = [
        Series(s, [counts.get((s, t), 0) / totals[s] for t in range(1, top + 1)]) for s in slices
    ]
    return line_chart(
        "Turns used per episode",
        [str(t) for t in range(1, top + 1)],
        series,
        x_title="turns used",
        y_title="share of finished episodes",
    )


def render_report(
    con: Any,
    cells: Sequence[Cell],
    by: Sequence[str],
    summary: dict[str, Any],
    extra_sections: Sequence[tuple[str, str]] = (),
) -> str:
    """The whole page. `extra_sections` are (title, preformatted text) pairs."""
    facts = "".join(
        f"<tr><td>{escape(str(k))}</td><td>{escape(str(v))}</td></tr>" for k, v in summary.items()
    )
    sections = [
        "<h2>Pass@(K,T)</h2><p class=muted>Mean over tasks of the unbiased estimator; shaded "
        "band: 95% bootstrap CI over tasks. Hidden episodes count at every T up to their budget; "
        "disclosed ones only at their own budget.</p>",
        f"<div class=charts>{''.join(pass_curves(cells))}</div>",
        pass_table(cells),
        "<h2>Success and exhaustion by budget tier</h2>",
        f"<div class=charts>{''.join(tier_charts(con, by))}</div>",
        "<h2>Turns used</h2>",
        f"<div class=charts>{turns_chart(con, by)}</div>",
    ]
    for title, text in extra_sections:
        sections.append(f"<h2>{escape(title)}</h2><pre>{escape(text)}</pre>")
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        "<meta name=viewport content='width=device-width, initial-scale=1'>"
        f"<title>budgetproxy analysis</title><style>{STYLE}</style></head><body>"
        f"<h1>Turn-budget analysis</h1><p class=muted>budgetproxy analyze, {stamp}</p>"
        f"<table>{facts}</table>{''.join(sections)}</body></html>\n"
    )
