"""`probe --over FIELD`: each checkpoint's next actions against one fixed reference (--b).

The A side is split by FIELD (a tag such as `step`, or `model`): checkpoint v is A's episodes
(those matching --a, when given) whose FIELD is v, minus the reference's. Each checkpoint is
probed as `probe --a FIELD=v --b REF` would probe it, from states matched against the
reference's, and the checkpoints come in the order `analyze --over` gives them: numerically
when every value is a number, else by first appearance (earliest episode start).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from budgetproxy.analysis.dynamics import checkpoint_order
from budgetproxy.probe.run import ProbeOptions, run_probe
from budgetproxy.probe.states import (
    Episode,
    ProbeInputError,
    field_value,
    matches,
    parse_selector,
    read_episodes,
)

VIEWS = ("single_step", "error_states", "continuation")


def checkpoint_episodes(
    episodes: Mapping[str, Episode], field: str, a: str | None, b: str
) -> tuple[list[str], dict[str, dict[str, Episode]]]:
    """The checkpoints in order, and per checkpoint the episodes its probe reads: the
    reference's and the checkpoint's own. A value whose every episode is the reference's is
    the reference, not a checkpoint."""
    sel_b = parse_selector(b)
    sel_a = parse_selector(a) if a is not None else None
    ref = {eid: ep for eid, ep in episodes.items() if matches(ep.record, sel_b)}
    starts: dict[str, str] = {}
    split: dict[str, dict[str, Episode]] = {}
    for eid, ep in episodes.items():
        rec = ep.record
        value = field_value(rec, field)
        if value is None or eid in ref or (sel_a is not None and not matches(rec, sel_a)):
            continue
        key = str(value)
        split.setdefault(key, {})[eid] = ep
        start = str(rec.get("started_at") or "~")
        starts[key] = min(start, starts.get(key, start))
    clash = sorted({str(field_value(ep.record, field)) for ep in ref.values()} & set(split))
    if clash:
        raise ProbeInputError(f"--over {field}: checkpoint(s) {', '.join(clash)} hold episodes "
                              f"of the reference {b} and others: narrow --a or --b")
    order = checkpoint_order(sorted(split, key=lambda v: (starts[v], v)))
    return order, {v: {**ref, **split[v]} for v in order}


async def run_probe_over(opts: ProbeOptions, field: str, a: str | None) -> dict[str, Any]:
    """One probe per checkpoint against the reference; `--json`'s shape in docs/probe.md."""
    episodes = read_episodes(opts.paths)
    order, per = checkpoint_episodes(episodes, field, a, opts.b)
    if not order:
        raise ProbeInputError(f"--over {field}: no episode beside the reference's ({opts.b}) "
                              "has this field or tag")
    points = []
    settings: dict[str, Any] = {}
    for value in order:
        checkpoint = replace(opts, a=f"{field}={value}")
        try:
            result = await run_probe(checkpoint, per[value])
        except ProbeInputError as e:  # a checkpoint without states to match is said, skipped
            print(f"budgetproxy probe: --over {field}={value}: {e}", file=sys.stderr)
            points.append({"value": value, **dict.fromkeys(VIEWS), "skipped": str(e)})
            continue
        settings = result["settings"]
        points.append({"value": value, **{k: result[k] for k in VIEWS},
                       "model": settings["model_a"], "probe_id": settings["probe_id"],
                       "probe_calls": settings["probe_calls"]})
    return {"over": points, "settings": {
        **{k: v for k, v in settings.items() if k not in ("a", "model_a", "probe_id",
                                                           "probe_calls", "episodes")},
        "over": field, "a": a, "b": opts.b, "reference": opts.b}}


def format_over(result: Mapping[str, Any]) -> str:
    """A row per checkpoint: its win rates against the reference, each with its 95% CI."""
    s = result.get("settings") or {}
    head = ["checkpoint", "single steps [95% CI]", "after errors [95% CI]", "states", "tasks"]
    rows = [head]
    few = False
    for p in result.get("over") or []:
        cells = [str(p["value"])]
        for key in ("single_step", "error_states"):
            view = p.get(key) or {}
            if view.get("win_rate") is None:
                cells.append("—")
                continue
            few |= bool(view.get("few_tasks"))
            cells.append(f"{100 * view['win_rate']:.1f}% [{100 * view['ci_low']:.1f}, "
                         f"{100 * view['ci_high']:.1f}]" + (" †" if view.get("few_tasks") else ""))
        single = p.get("single_step") or {}
        cells += [str(single.get("n_states", 0)), str(single.get("n_tasks", 0))]
        rows.append(cells)
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = [f"Win rate of each checkpoint ({s.get('over')}) over the reference "
             f"{s.get('reference')}: the share of matched states where its mean action value "
             "is higher (ties apart); 95% bootstrap CIs over tasks."]
    lines += ["  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                        for i, (c, w) in enumerate(zip(r, widths, strict=True))) for r in rows]
    if few:
        lines.append("†: fewer than 10 tasks: the interval rests on too few draws to name a "
                     "winner.")
    lines += [f"{p['value']}: skipped: {p['skipped']}" for p in result.get("over") or []
              if p.get("skipped")]
    return "\n".join(lines)


def html_over(result: Mapping[str, Any]) -> str:
    """The report's section: both win rates against the checkpoint, with their intervals."""
    from html import escape

    from budgetproxy.analysis.svg import Series, line_chart

    s = result.get("settings") or {}
    points = result.get("over") or []
    series = []
    for key, name, color in (("single_step", "single steps", "#1f77b4"),
                             ("error_states", "after errors", "#d62728")):
        views = [p.get(key) or {} for p in points]
        series.append(Series(name, [v.get("win_rate") for v in views],
                             [v.get("ci_low") for v in views], [v.get("ci_high") for v in views],
                             color=color,
                             tips=[f"{v.get('n_states', 0)} states, {v.get('n_tasks', 0)} tasks"
                                   for v in views]))
    svg = line_chart(f"Win rate over {s.get('reference')}", [str(p["value"]) for p in points],
                     series, x_title=f"checkpoint ({s.get('over')})",
                     y_title="share of states won", y_max=1.0, empty="no checkpoint compared")
    return (f"<h2>State diagnostics per checkpoint ({escape(str(s.get('over')))})</h2>"
            f"<figure>{svg}<figcaption>Bands: 95% bootstrap CI over tasks; 50% is no "
            "difference from the reference.</figcaption></figure>"
            f"<pre>{escape(format_over(result))}</pre>")
