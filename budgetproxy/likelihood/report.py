"""The likelihood view as text, and as an HTML section or a page of its own."""

from __future__ import annotations

from collections.abc import Mapping
from html import escape
from typing import Any

from budgetproxy.analysis.stats import FEW_TASKS

SIDES = (("a", "A"), ("b", "B"))


def _n(v: Any, signed: bool = False) -> str:
    return "—" if v is None else f"{float(v):+.2f}" if signed else f"{float(v):.2f}"


def _ci(lo: Any, hi: Any, signed: bool = False) -> str:
    return "" if lo is None else f" [{_n(lo, signed)}, {_n(hi, signed)}]"


def lines(result: Mapping[str, Any]) -> list[str]:
    """What the view found, a line per figure, each with its 95% interval."""
    s = result.get("settings") or {}
    step, llr, lm = result["per_step"], result["trajectory_llr"], result["length_matched"]
    out = [f"A = {s.get('a')} ({s.get('model_a')}), B = {s.get('b')} ({s.get('model_b')}); "
           f"reference {s.get('reference')}; 95% bootstrap CIs over tasks."]
    out.append("Per-step NLL under the reference (nats per action):")
    for side, name in SIDES:
        v = step[side]
        q = v.get("quantiles") or {}
        out.append(f"  {name}: {_n(v['nll_mean'])}{_ci(v['ci_low'], v['ci_high'])} over "
                   f"{v['n']} actions, {v['n_tasks']} tasks; per token "
                   f"{_n(v.get('nll_per_token'))}; p10/p50/p90 {_n(q.get('p10'))}/"
                   f"{_n(q.get('p50'))}/{_n(q.get('p90'))}")
    d = step.get("diff") or {}
    if d.get("nll_diff") is not None:
        out.append(f"  A − B: {_n(d['nll_diff'], True)}{_ci(d['ci_low'], d['ci_high'], True)}")
    out.append("Trajectory log π_policy(τ)/π_ref(τ) (nats):")
    for side, name in SIDES:
        for kind in ("success", "failure"):
            v = llr[f"{side}_{kind}"]
            out.append(f"  {name}, {kind}: {_n(v['llr_mean'], True)}"
                       f"{_ci(v['ci_low'], v['ci_high'], True)} over {v['n']} trajectories, "
                       f"{v['n_tasks']} tasks")
    out.append(f"Length-matched (output tokens within {100 * lm['tolerance']:.0f}% of the "
               f"longer), A − B over {lm['n_pairs']} pairs, {lm['n_tasks']} tasks:")
    out.append(f"  trajectory LLR: {_n(lm['diff_nats'], True)}"
               f"{_ci(lm['ci_low'], lm['ci_high'], True)} nats")
    out.append(f"  reference NLL: {_n(lm['ref_nll_diff_nats'], True)}"
               f"{_ci(lm['ref_nll_ci_low'], lm['ref_nll_ci_high'], True)} nats")
    few = [name for name, v in (("per-step A", step["a"]), ("per-step B", step["b"]),
                                ("length-matched", lm)) if v.get("few_tasks")]
    if few:
        out.append(f"Fewer than {FEW_TASKS} tasks behind {', '.join(few)}: the intervals rest "
                   "on too few draws to name a difference by.")
    own = s.get("own_logprobs") or {}
    methods = ", ".join(f"{m}: {w}" for m, w in (s.get("methods") or {}).items()) or str(
        s.get("method"))
    out.append(f"log π_policy from captured logprobs for {own.get('captured', 0)} "
               f"trajectories, scored under the policy's own model for {own.get('scored', 0)}; "
               f"{s.get('scoring_calls', 0)} scoring calls ({methods}).")
    if s.get("scoring_failures"):
        out.append(f"Left out: {s['scoring_failures']} scoring call(s) failed, "
                   f"{s.get('trajectories_left_out', 0)} trajectories not fully scored.")
        out += [f"  {m}" for m in s.get("failure_examples", [])]
    return out


def format_text(result: Mapping[str, Any]) -> str:
    return "\n".join(lines(result))


def html_section(result: Mapping[str, Any]) -> str:
    """The view's section of an HTML report."""
    body = "".join(f"<li>{escape(line)}</li>" for line in lines(result)[1:])
    s = result.get("settings") or {}
    return ("<h2>Likelihood view (budgetproxy likelihood)</h2>"
            f"<p>A = <b>{escape(str(s.get('a')))}</b>, B = <b>{escape(str(s.get('b')))}</b>, "
            f"reference <b>{escape(str(s.get('reference')))}</b>: each logged action scored "
            "under the reference; 95% bootstrap CIs over tasks.</p>"
            f"<ul class='notes'>{body}</ul>")


def html_page(result: Mapping[str, Any]) -> str:
    style = "body{font:14px/1.45 system-ui,sans-serif;margin:24px auto;max-width:1100px}"
    return ("<!doctype html><html><head><meta charset='utf-8'><title>budgetproxy likelihood"
            f"</title><style>{style}</style></head><body><h1>budgetproxy likelihood</h1>"
            f"{html_section(result)}</body></html>\n")
