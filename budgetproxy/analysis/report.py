"""The HTML report: one self-contained page of Pass@T curves, tier and turn charts."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from html import escape
from typing import Any

from budgetproxy.analysis.compare import Difference
from budgetproxy.analysis.compare_chart import difference_charts
from budgetproxy.analysis.passk import tier_to_turns
from budgetproxy.analysis.stats import FEW_TASKS_NOTE, PILED_NOTE, ratio_ci
from budgetproxy.analysis.svg import (
    PALETTE,
    Series,
    bar_chart,
    ci_mark,
    line_chart,
)
from budgetproxy.analysis.table import Cell, by_expression, interval_text, table_notes

STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; color: #222; margin: 24px auto; max-width: 1360px;
       padding: 0 20px; }
h1 { font-size: 22px; } h2 { font-size: 17px; margin-top: 32px; border-bottom: 1px solid #ddd; }
.charts { display: grid; grid-template-columns: repeat(auto-fill, minmax(460px, 1fr));
          gap: 20px 32px; align-items: start; }
figure { margin: 0; } figure svg { display: block; width: 100%; height: auto; }
figcaption { color: #555; font-size: 13px; margin: 4px 0 0 4px; max-width: 62em; }
table { border-collapse: collapse; font-variant-numeric: tabular-nums; }
th, td { padding: 3px 10px; border-bottom: 1px solid #eee; text-align: right; }
th:first-child, td:first-child { text-align: left; }
.muted { color: #666; } .notes { color: #555; margin: 6px 0; padding-left: 20px; }
.charts + table { margin-top: 24px; }
pre { background: #f6f6f6; padding: 8px; white-space: pre-wrap; }
"""

TIER_SQL = "5 * ((40 * budget + max_turns) // (2 * max_turns))"  # the proxy's tier label, in %

# Per slice and budget tier: finished episodes, successes, and those whose end reason is
# `exhausted`. The `exhausted` flag is not used: it is also set on an episode that succeeded on
# its last allowed turn, whose end reason is `success` (success > exhausted > failure).
# Per task too (an episode without a task_id is its own cluster): the intervals resample tasks.
TIERS_SQL = f"""
SELECT {{slice}} AS slice,
    CASE WHEN max_turns IS NULL OR max_turns <= 0 OR budget IS NULL THEN NULL
         ELSE {TIER_SQL} END AS tier,
    coalesce(task_id, '\x00' || episode_id) AS task,
    count(*), count(*) FILTER (WHERE success),
    count(*) FILTER (WHERE end_reason = 'exhausted' AND NOT success)
FROM episodes WHERE end_reason <> 'abandoned' GROUP BY ALL ORDER BY ALL
"""

BINS = 10  # turns used, in tenths of the episode's budget
TURN_LABELS = ["0", *(f"{10 * (b - 1)}–{10 * b}" for b in range(1, BINS + 1)), "all"]

# Per slice: episodes by turns used as a share of their own budget. Bin 0 = no turn, bins
# 1..BINS = (b-1, b] tenths (ceil, in exact integers), BINS + 1 = the whole budget.
TURNS_SQL = f"""
SELECT {{slice}} AS slice,
    CASE WHEN turns_used >= budget THEN {BINS + 1} WHEN turns_used <= 0 THEN 0
         ELSE ({BINS} * turns_used + budget - 1) // budget END AS bin,
    count(*)
FROM episodes
WHERE end_reason <> 'abandoned' AND budget > 0 AND turns_used IS NOT NULL GROUP BY ALL
"""


@dataclass(frozen=True)
class TierRates:
    """Finished episodes of one slice at one budget tier, and how they ended, with 95%
    bootstrap intervals over tasks for the two shares."""

    finished: int
    succeeded: int
    exhausted: int
    tasks: int = 0
    success_ci: tuple[float, float] | None = None
    exhausted_ci: tuple[float, float] | None = None


def slice_sql(by: Sequence[str]) -> str:
    """SQL naming an episode's slice, e.g. "hidden · qwen3-4b"."""
    parts = [f"coalesce({by_expression(f)}, '-')" for f in by]
    return " || ' · ' || ".join(parts) if parts else "'all'"


def _slice_name(cell: Cell) -> str:
    return " · ".join("-" if v is None else v for _, v in cell.by) or "all"


def _pct(v: float | None) -> str:
    return "—" if v is None else f"{100 * v:.1f}"


def _in_page_order(names: set[str], colors: Mapping[str, str]) -> list[str]:
    return [n for n in colors if n in names] + sorted(names - set(colors))


def _figure(svg: str, caption: str) -> str:
    text = f"<figcaption>{caption}</figcaption>" if caption else ""
    return f"<figure>{svg}{text}</figure>"


def pass_curves(
    cells: Sequence[Cell], colors: Mapping[str, str], max_turns: int | None = None
) -> list[str]:
    """One chart per K (and per kind of T): Pass@(K,T) over T, a line and CI per slice. When
    every task has the same `max_turns`, tier labels also say the turns they stand for."""
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
                        color=colors.get(name),
                        tips=[f"{row[b].n_tasks} tasks" if b in row else None for b in budgets],
                    )
                )
            empty = (
                f"no data (fewer than {k} eligible episodes per task)"
                if k > 1
                else "no data (no eligible episodes)"
            )
            labels, axis = [b.label for b in budgets], x_title
            if kind == "tier" and max_turns is not None:
                labels = [f"{b.label} ({tier_to_turns(b.value, max_turns)})" for b in budgets]
                axis = f"turn budget T, % of max_turns = {max_turns} (in turns)"
            svg = line_chart(
                f"Pass@({k},T)",
                labels,
                series,
                x_title=axis,
                y_title=f"Pass@{k}",
                y_max=1.0,
                empty=empty,
            )
            drawn = [c for c in mine if c.k == k and c.value is not None]
            counts = sorted({c.n_tasks for c in drawn})
            caption = f"{ci_mark(series).capitalize()}: 95% bootstrap CI over tasks. "
            caption += f"Tasks per point: {_span(counts)} (hover a point for its own)."
            if any(c.few_tasks for c in drawn):
                caption += f" Points on {FEW_TASKS_NOTE} rest on few draws."
            if any(c.piled for c in drawn):
                caption += f" Points marked ‡ in the table have {PILED_NOTE}."
            undrawn = [s.name for s in series if not s.has_data]
            if len(undrawn) == len(series):
                caption = ""  # the empty chart says why
            elif undrawn:
                caption += (
                    f" Not drawn, with fewer than {k} eligible episodes per task at every T: "
                    f"{escape(', '.join(undrawn))}."
                )
            charts.append(_figure(svg, caption))
    return charts


def _pass_td(cell: Cell | None) -> str:
    if cell is None or cell.value is None:
        return "<td>—</td>"
    fewer = f" ({cell.n_tasks})" if cell.n_tasks < cell.tasks_eligible else ""
    few = " †" if cell.few_tasks else ""
    pile = " ‡" if cell.piled else ""
    return (
        f"<td>{_pct(cell.value)} <span class=muted>{escape(interval_text(cell))}{fewer}{few}"
        f"{pile}</span></td>"
    )


def pass_table(cells: Sequence[Cell]) -> str:
    """Pass@(K,T) per slice and T, with the same columns and legend as the terminal table."""
    ks = list(dict.fromkeys(c.k for c in cells))
    rows: dict[tuple[str, str], dict[int, Cell]] = {}
    for c in cells:
        rows.setdefault((_slice_name(c), c.budget.label), {})[c.k] = c
    head = "".join(f"<th>K={k}</th>" for k in ks)
    body = []
    for (name, label), by_k in rows.items():
        first = next(iter(by_k.values()))
        tds = "".join(_pass_td(by_k.get(k)) for k in ks)
        body.append(
            f"<tr><td>{escape(name)}</td><td>{escape(label)}</td>"
            f"<td>{first.tasks_eligible:,}</td><td>{first.episodes_eligible:,}</td>{tds}</tr>"
        )
    left_out = any(c.value is not None and c.n_tasks < c.tasks_eligible for c in cells)
    missing = any(c.value is None for c in cells)
    few = any(c.few_tasks for c in cells)
    zero = any(c.ci_note is not None for c in cells)
    pile = any(c.value is not None and c.piled for c in cells)
    notes = [
        "Pass@(K,T) in %, mean over tasks, [95% bootstrap CI over tasks].",
        *table_notes(left_out, missing, few, zero, piled=pile),
    ]
    items = "".join(f"<li>{escape(n)}</li>" for n in notes)
    return (
        f"<table><tr><th>slice</th><th>T</th><th>tasks</th><th>episodes</th>{head}</tr>"
        f"{''.join(body)}</table><ul class=notes>{items}</ul>"
    )


def tier_rates(
    con: Any, by: Sequence[str], resamples: int = 1000, seed: int = 0
) -> dict[tuple[str, int | None], TierRates]:
    """(slice, tier in %) → finished, succeeded and exhausted episodes; tier None: no
    max_turns."""
    per_task: dict[tuple[str, int | None], list[tuple[int, int, int]]] = {}
    for r in con.execute(TIERS_SQL.format(slice=slice_sql(by))).fetchall():
        key = (str(r[0]), None if r[1] is None else int(r[1]))
        per_task.setdefault(key, []).append((int(r[3]), int(r[4]), int(r[5])))
    out = {}
    for key, tasks in per_task.items():
        finished = [t[0] for t in tasks]
        out[key] = TierRates(
            sum(finished), sum(t[1] for t in tasks), sum(t[2] for t in tasks), len(tasks),
            ratio_ci([t[1] for t in tasks], finished, resamples, seed),
            ratio_ci([t[2] for t in tasks], finished, resamples, seed),
        )  # fmt: skip
    return out


def tier_charts(
    con: Any, by: Sequence[str], colors: Mapping[str, str], resamples: int = 1000, seed: int = 0
) -> list[str]:
    rates = tier_rates(con, by, resamples, seed)
    slices = _in_page_order({s for s, _ in rates}, colors)
    tiers = sorted({t for _, t in rates if t is not None})
    no_tier = sum(r.finished for (_, t), r in rates.items() if t is None)
    labels = [f"{t}%" for t in tiers]
    aside = (
        f" {no_tier:,} episode(s) without max_turns have no tier and are not shown."
        if no_tier
        else ""
    )
    charts = []
    tasks = sorted({r.tasks for r in rates.values()})
    counted = (
        f" Whiskers: 95% bootstrap intervals over tasks ({_span(tasks)} tasks per bar); the "
        "number over a bar (where it fits, and on hover) is its episodes."
    )
    if any(r.tasks == 1 for (s, t), r in rates.items() if t is not None):
        counted += (" Hatched bars rest on one task (n = 1 task, no interval): an interval over "
                    "tasks needs two, so they have no whisker and are no firmer than the rest.")
    kinds: list[tuple[str, str, Callable[[TierRates], int], str]] = [
        (
            "Success by budget tier",
            "share of finished episodes",
            lambda r: r.succeeded,
            "Share of finished (not abandoned) episodes that reported success.",
        ),
        (
            "Exhaustion by budget tier",
            "share ending “exhausted”",
            lambda r: r.exhausted,
            "Share of finished episodes whose end reason is <i>exhausted</i>: the budget ran "
            "out (or a turn past it was refused) with no success. An episode that succeeded on "
            "its last allowed turn counts as a success, not here; success, exhausted and "
            "failure add up to 100% per tier.",
        ),
    ]
    for title, y_title, pick, caption in kinds:
        series = []
        for s in slices:
            here = [rates.get((s, t)) for t in tiers]
            cis = [
                None if r is None else (r.success_ci if title.startswith("Success")
                                        else r.exhausted_ci)
                for r in here
            ]  # fmt: skip
            single = [r is not None and r.tasks == 1 for r in here]
            series.append(
                Series(
                    s,
                    [None if r is None else pick(r) / r.finished for r in here],
                    low=[None if ci is None or one else ci[0] for ci, one in zip(cis, single,
                                                                              strict=True)],
                    high=[None if ci is None or one else ci[1] for ci, one in zip(cis, single,
                                                                               strict=True)],
                    color=colors.get(s),
                    tips=[
                        None if r is None else f"{pick(r)} of {r.finished} episodes, "
                        + ("n = 1 task, no interval" if r.tasks == 1 else f"{r.tasks} tasks")
                        for r in here
                    ],
                    counts=[None if r is None else str(r.finished) for r in here],
                    hatched=single,
                )
            )
        svg = bar_chart(
            title,
            labels,
            series,
            x_title="budget / max_turns (the proxy's tier, to the nearest 5%)",
            y_title=y_title,
            y_max=1.0,
            empty="no data (no finished episode has max_turns)",
        )
        charts.append(_figure(svg, caption + counted + aside))
    return charts


def _span(values: Sequence[int]) -> str:
    if not values:
        return "0"
    return str(values[0]) if values[0] == values[-1] else f"{values[0]}–{values[-1]}"


def turns_chart(con: Any, by: Sequence[str], colors: Mapping[str, str]) -> str:
    """A histogram of turns used as a share of each episode's own budget: budgets differ across
    tiers and tasks, so raw turn counts would pool unlike things."""
    rows = con.execute(TURNS_SQL.format(slice=slice_sql(by))).fetchall()
    counts = {(str(r[0]), int(r[1])): int(r[2]) for r in rows}
    slices = _in_page_order({s for s, _ in counts}, colors)
    # bin 0 (no turn at all) only when some episode is in it
    bins = [b for b in range(len(TURN_LABELS)) if b or any(c for (_, x), c in counts.items()
                                                          if x == 0)]  # fmt: skip
    totals = {s: sum(n for (name, _), n in counts.items() if name == s) for s in slices}
    series = [
        Series(
            s,
            [counts.get((s, b), 0) / totals[s] for b in bins],
            color=colors.get(s),
            tips=[f"{counts.get((s, b), 0)} of {totals[s]}" for b in bins],
        )
        for s in slices
    ]
    svg = bar_chart(
        "Turns used, as a share of the episode's budget",
        [TURN_LABELS[b] for b in bins],
        series,
        x_title="turns used, % of the episode's own budget",
        y_title="share of finished episodes",
        empty="no data (no finished episode with a budget)",
    )
    caption = (
        "Bins are ranges of each episode's own budget, upper end included: 20–30 holds the "
        "episodes that used more than 20% and at most 30% of it. <i>all</i>: the whole budget "
        "was used; those episodes are not in 90–100. Shares are of each slice's finished "
        "episodes."
    )
    return _figure(svg, caption)


TASKS_SQL = """
SELECT task_id, count(*), count(*) FILTER (WHERE success),
    count(*) FILTER (WHERE end_reason = 'exhausted' AND NOT success),
    count(*) FILTER (WHERE end_reason = 'abandoned')
FROM episodes GROUP BY task_id ORDER BY task_id NULLS LAST
"""


def task_table(con: Any, episode_view: str | None) -> str:
    """One row per task: its episodes and how they ended. With `episode_view` (the episode
    view's folder, relative to the report) each task links to its page there, which lists the
    task's episodes, each linking to its turns."""
    from budgetproxy.view.page import INDEX, task_page_name

    rows = []
    for task, total, won, exhausted, abandoned in con.execute(TASKS_SQL).fetchall():
        name = escape(str(task)) if task is not None else "<i>no task id</i>"
        if episode_view is not None:
            href = escape(f"{episode_view}/{task_page_name(task)}", quote=True)
            name = f"<a href='{href}'>{name}</a>"
        rows.append(f"<tr><td>{name}</td><td>{total:,}</td><td>{won:,}</td>"
                    f"<td>{exhausted:,}</td><td>{abandoned:,}</td></tr>")  # fmt: skip
    note = (
        f"Each task links to its episodes in the <a href='{escape(episode_view, quote=True)}/"
        f"{INDEX}'>episode view</a>, and each episode to its turns."
        if episode_view is not None
        else "budgetproxy analyze --view DIR (or budgetproxy view) writes a page per episode "
        "and links these rows to them."
    )
    return (
        "<table><tr><th>task</th><th>episodes</th><th>succeeded</th><th>exhausted</th>"
        f"<th>abandoned</th></tr>{''.join(rows)}</table><p class=muted>{note}</p>"
    )


def slice_colors(cells: Sequence[Cell], con: Any, by: Sequence[str]) -> dict[str, str]:
    """One colour per slice for the whole page, in the table's slice order."""
    names = list(dict.fromkeys(_slice_name(c) for c in cells))
    rows = con.execute(f"SELECT DISTINCT {slice_sql(by)} FROM episodes").fetchall()
    names += sorted({str(r[0]) for r in rows} - set(names))
    return {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(names)}


def render_report(
    con: Any,
    cells: Sequence[Cell],
    by: Sequence[str],
    summary: dict[str, Any],
    extra_sections: Sequence[tuple[str, str]] = (),
    differences: Sequence[Sequence[Difference]] = (),
    resamples: int = 1000,
    seed: int = 0,
    episode_view: str | None = None,
    sections_after: Sequence[str] = (),
) -> str:
    """The whole page. `extra_sections` are (title, preformatted text) pairs; `differences`
    the --compare results, one list per comparison; `episode_view` the folder of the episode
    pages, relative to the report, which the task rows link to; `sections_after` HTML
    sections placed after the Pass@(K,T) table (the ceiling, training dynamics)."""
    facts = "".join(
        f"<tr><td>{escape(str(k))}</td><td>{escape(str(v))}</td></tr>" for k, v in summary.items()
    )
    colors = slice_colors(cells, con, by)
    shared = con.execute(
        "SELECT DISTINCT max_turns FROM episodes WHERE max_turns IS NOT NULL LIMIT 2"
    ).fetchall()
    max_turns = int(shared[0][0]) if len(shared) == 1 else None
    sections = [
        "<h2>Pass@(K,T)</h2><p class=muted>Mean over tasks of the unbiased estimator, with 95% "
        "bootstrap CIs over tasks. Hidden episodes count at every T up to their budget; "
        "disclosed ones only at their own budget.</p>",
        f"<div class=charts>{''.join(pass_curves(cells, colors, max_turns))}</div>",
        pass_table(cells),
        *sections_after,
    ]
    if differences:
        sections += [
            "<h2>Paired differences</h2><p class=muted>Per task, the difference of the two "
            "values' Pass@(K,T) estimates; its mean over the tasks that have both, with a 95% "
            "bootstrap interval that resamples tasks with their pair.</p>",
            f"<div class=charts>{''.join(difference_charts(differences))}</div>",
        ]
    sections += [
        "<h2>Success and exhaustion by budget tier</h2>",
        f"<div class=charts>{''.join(tier_charts(con, by, colors, resamples, seed))}</div>",
        "<h2>Turns used</h2>",
        f"<div class=charts>{turns_chart(con, by, colors)}</div>",
        "<h2>Tasks</h2>",
        task_table(con, episode_view),
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
