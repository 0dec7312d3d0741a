"""The probe's results as a text table, and as an HTML section or a page of its own."""

from __future__ import annotations

from collections.abc import Mapping
from html import escape
from typing import Any

from budgetproxy.analysis.stats import FEW_TASKS

VIEWS = (("single_step", "single steps"), ("error_states", "after errors"))


def _p(v: Any) -> str:
    return "—" if v is None else f"{100 * float(v):.1f}%"


def _ci(view: Mapping[str, Any]) -> str:
    if view.get("ci_low") is None:
        return "—"
    return f"[{_p(view['ci_low'])}, {_p(view['ci_high'])}]"


def _diff(v: Any) -> str:
    return "—" if v is None else f"{float(v):+.4f}"


def _diff_ci(view: Mapping[str, Any]) -> str:
    out = _diff(view.get("mean_diff"))
    if view.get("diff_ci_low") is not None:
        out += f" [{_diff(view['diff_ci_low'])}, {_diff(view['diff_ci_high'])}]"
    return out


def _net(view: Mapping[str, Any]) -> str:
    if view.get("net_win") is None:
        return "—"
    out = f"{100 * float(view['net_win']):+.0f}"
    if view.get("net_ci_low") is not None:
        out += f" [{100 * float(view['net_ci_low']):+.0f}, {100 * float(view['net_ci_high']):+.0f}]"
    return out


def _row(label: str, depth: str, view: Mapping[str, Any]) -> list[str]:
    return [label, depth, _p(view.get("win_rate")), _p(view.get("tie_rate")), _ci(view),
            _net(view), _diff_ci(view), str(view.get("n_states", 0))]


def rows(result: Mapping[str, Any]) -> list[list[str]]:
    """Header and one row per view and depth: wins, ties, the wins' CI, net wins (wins −
    losses, in points, with CI), the mean value difference (with CI), states."""
    out = [["view", "depth", "A wins", "ties", "95% CI (wins)", "net [95% CI]",
            "mean A−B [95% CI]", "states"]]
    for key, label in VIEWS:
        view = result.get(key) or {}
        out.append(_row(label, "all", view))
        out += [_row("", d["depth"], d) for d in view.get("by_depth") or [] if d.get("n_states")]
    return out


def _lines_after(result: Mapping[str, Any]) -> list[str]:
    s = result.get("settings") or {}
    lines = []
    for key, label in VIEWS:
        tasks = (result.get(key) or {}).get("by_task") or []
        if tasks:
            lines.append(f"A wins {label}, by task: " + ", ".join(
                f"{t['task_id']} {_p(t['win_rate'])} (ties {_p(t['tie_rate'])}, "
                f"{t['n_states']} states)" for t in tasks))
    for key, label in VIEWS:
        view = result.get(key) or {}
        if view.get("few_tasks"):
            lines.append(f"{label.capitalize()}: {view.get('n_tasks')} tasks, fewer than "
                         f"{FEW_TASKS}: the intervals rest on too few draws to name a winner.")
    corr = (result.get("error_states") or {}).get("correction")
    if corr:
        lines.append(f"Error correction (next action fixes or abandons the failed call): "
                     f"A {_p(corr['a_rate'])}, B {_p(corr['b_rate'])} of {corr['n_states']} "
                     "states.")
    cont = result.get("continuation")
    if cont:
        lines.append(f"Continuation to the end from the same states: A succeeded "
                     f"{_p(cont['a_success'])}, B {_p(cont['b_success'])} "
                     f"(A−B 95% CI [{_diff(cont['ci_low'])}, {_diff(cont['ci_high'])}], "
                     f"{cont['n_states']} states).")
    if s.get("inject"):
        lines.append(f"Injected error states: {s.get('injected_states', 0)}, as many from A's "
                     f"trajectories as from B's per task; {s.get('not_injectable', 0)} state(s) "
                     f"could take no error, {s.get('injected_unmatched', 0)} had no "
                     "counterpart from the other policy and were left out.")
    failed = s.get("scorer_failures", 0) + s.get("sampling_failures", 0)
    if failed:
        lines.append(f"Left out: {s.get('scorer_failures', 0)} action(s) the scorer could not "
                     f"score, {s.get('sampling_failures', 0)} sampling call(s) that failed, "
                     f"{s.get('states_left_out', 0)} state(s) without a scored action per side.")
        lines += [f"  {m}" for m in s.get("failure_examples", [])]
    return lines


def format_text(result: Mapping[str, Any]) -> str:
    s = result.get("settings") or {}
    table = rows(result)
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    text = [f"A = {s.get('a')} ({s.get('model_a')}), B = {s.get('b')} ({s.get('model_b')}); "
            f"scorer {s.get('scorer')}; {s.get('samples')} samples per state and policy; "
            "95% bootstrap CIs over tasks."]
    for r in table:
        text.append("  ".join(c.ljust(w) if i < 2 else c.rjust(w)
                              for i, (c, w) in enumerate(zip(r, widths, strict=True))))
    return "\n".join([*text, *_lines_after(result)])


def html_section(result: Mapping[str, Any]) -> str:
    """The probe's section of an HTML report."""
    s = result.get("settings") or {}
    table = rows(result)
    head = "".join(f"<th>{escape(c)}</th>" for c in table[0])
    body = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in r) + "</tr>"
                   for r in table[1:])
    notes = "".join(f"<li>{escape(line)}</li>" for line in _lines_after(result))
    return (
        "<h2>State diagnostics (budgetproxy probe)</h2>"
        f"<p>A = <b>{escape(str(s.get('a')))}</b>, B = <b>{escape(str(s.get('b')))}</b>: "
        "from the same states, the share where A's mean action value beats B's (ties apart), "
        f"scored by {escape(str(s.get('scorer')))}, {s.get('samples')} samples per state and "
        "policy; states sampled equally from each policy's own trajectories, by task; "
        "95% bootstrap CIs over tasks; depth is how far into its trajectory a state was.</p>"
        f"<table><tr>{head}</tr>{body}</table>"
        + (f"<ul class='notes'>{notes}</ul>" if notes else "")
    )


def html_page(result: Mapping[str, Any], section: str | None = None) -> str:
    """A self-contained page holding the section (the probe's, unless given)."""
    style = ("body{font:14px/1.45 system-ui,sans-serif;margin:24px auto;max-width:1100px;"
             "padding:0 20px}table{border-collapse:collapse}th,td{padding:3px 10px;"
             "border-bottom:1px solid #eee;text-align:right}th:first-child,td:first-child"
             "{text-align:left}")
    return ("<!doctype html><html><head><meta charset='utf-8'><title>budgetproxy probe"
            f"</title><style>{style}</style></head><body><h1>budgetproxy probe</h1>"
            f"{html_section(result) if section is None else section}</body></html>\n")
