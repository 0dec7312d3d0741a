"""The demo's probe: careful against recovering from the same FrozenLake states, with Q*.

``budgetproxy probe`` runs on the demo's own trajectories, sampling next actions from the
demo's simulated model through a proxy with the demo's config. That proxy logs to
``OUT/probe/trajectories`` so the probe's calls and its continuation episodes stay out of the
demo's Pass@(K,T) logs. The claims printed are read from the probe's result, including when
an expected effect did not show.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from budgetproxy.analysis.stats import FEW_TASKS

A, B = "careful", "recovering"
PROBE_FILE = "probe.json"


def run_demo_probe(out: Path, traj: Path, proxy_config: Any, *, states: int, samples: int,
                   rollouts: int, seed: int) -> dict[str, Any]:
    """Start a proxy with `proxy_config` (the demo's, logging under OUT/probe), run the
    probe on the demo's logs through it, write OUT/probe.json and return the result."""
    from budgetproxy.probe import ProbeOptions, load_scorer, run_probe
    from budgetproxy.serve.server import ProxyServer

    with ProxyServer(proxy_config) as proxy:
        result = asyncio.run(run_probe(ProbeOptions(
            paths=[traj], a=f"policy={A}", b=f"policy={B}", scorer=load_scorer("frozenlake"),
            proxy=proxy.url, states=states, samples=samples, inject="action", continue_=True,
            rollouts=rollouts, seed=seed)))
    (out / PROBE_FILE).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return result


def _pct(v: float) -> str:
    return f"{100 * v:.0f}%"


def _view(view: Mapping[str, Any], where: str, expected: str) -> str:
    if not view.get("n_states"):
        return f"{where}: no states to compare."
    win, tie = float(view["win_rate"]), float(view["tie_rate"])
    net, lo, hi = (float(view[k]) for k in ("net_win", "net_ci_low", "net_ci_high"))
    diff, d_lo, d_hi = (float(view[k]) for k in ("mean_diff", "diff_ci_low", "diff_ci_high"))
    leader = A if net > 0 else B if net < 0 else None
    shown = ""
    if view.get("few_tasks"):
        verdict = _too_few(view)
    elif leader is None:
        verdict = "neither wins more states"
    else:
        # whether each interval is clear of no difference, on the leader's side
        by_states, by_value = (lo > 0, d_lo > 0) if leader == A else (hi < 0, d_hi < 0)
        verdict = f"{leader} wins" + {
            (True, True): "",
            (True, False): " (by states won; the mean-value interval includes no difference)",
            (False, True): " (by mean action value; the states-won interval includes no "
                           "difference)",
            (False, False): " (both intervals include no difference)",
        }[(by_states, by_value)]
        shown = " — as expected" if leader == expected else " — not the expected picture"
    return (f"{where} ({view['n_states']} states, Q* of each action): {A}'s actions beat "
            f"{B}'s on {_pct(win)} [95% CI {_pct(float(view['ci_low']))}–"
            f"{_pct(float(view['ci_high']))}], lose on {_pct(1 - win - tie)}, tie on "
            f"{_pct(tie)}; net {100 * net:+.0f} points [95% CI {100 * lo:+.0f} to "
            f"{100 * hi:+.0f}]; mean Q* {A} − {B} {diff:+.3f} [95% CI {d_lo:+.3f} to "
            f"{d_hi:+.3f}]: {verdict}{shown}.")


def _too_few(view: Mapping[str, Any]) -> str:
    """An interval over fewer than FEW_TASKS maps names no winner (the few_tasks flag)."""
    return f"{view.get('n_tasks')} maps: fewer than {FEW_TASKS}, too few to name a winner"


def claims(result: Mapping[str, Any]) -> list[str]:
    """The probe's two-sided picture, each claim with its interval."""
    lines = ["State diagnostics (budgetproxy probe, matched states, bootstrap CIs over maps):",
             "- " + _view(result["single_step"], "Single steps", A),
             "- " + _view(result["error_states"], "After an injected error (a slide)", B)]
    cont = result.get("continuation")
    if cont and cont.get("n_states"):
        lines.append(
            f"- Played on from the same error states: {A} reached the goal in "
            f"{_pct(cont['a_success'])}, {B} in {_pct(cont['b_success'])} "
            f"({A} − {B} 95% CI {100 * cont['ci_low']:+.0f} to {100 * cont['ci_high']:+.0f} "
            "points" + (f"; {_too_few(cont)}" if cont.get("few_tasks") else "") + ").")
    return lines


def add_to_report(report: Path, result: Mapping[str, Any]) -> None:
    """The probe's section, appended to the demo's HTML report."""
    from budgetproxy.probe.report import html_section

    append_section(report, html_section(result))


def append_section(report: Path, section: str) -> None:
    """`section` added at the end of the demo's HTML report, inside its body."""
    page = report.read_text(encoding="utf-8")
    page = page.replace("</body>", section + "</body>") if "</body>" in page else page + section
    report.write_text(page, encoding="utf-8")
