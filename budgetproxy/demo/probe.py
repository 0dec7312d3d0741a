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
    loss = 1 - win - tie
    even = (1 - tie) / 2  # the win rate at which A and B win equally often
    lo, hi = float(view["ci_low"]), float(view["ci_high"])
    leader = A if win > loss else B if loss > win else None
    if leader is None:
        verdict = "neither wins"
    else:
        clear = lo > even if leader == A else hi < even
        verdict = f"{leader} wins{'' if clear else ' (the interval includes an even split)'}"
    shown = " — as expected" if leader == expected else " — not the expected picture"
    return (f"{where} ({view['n_states']} states, Q* of each action): {A}'s actions beat "
            f"{B}'s on {_pct(win)} [95% CI {_pct(lo)}–{_pct(hi)}], lose on {_pct(loss)}, "
            f"tie on {_pct(tie)}: {verdict}{shown}.")


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
            "points).")
    return lines


def add_to_report(report: Path, result: Mapping[str, Any]) -> None:
    """The probe's section, appended to the demo's HTML report."""
    from budgetproxy.probe.report import html_section

    page = report.read_text(encoding="utf-8")
    section = html_section(result)
    page = page.replace("</body>", section + "</body>") if "</body>" in page else page + section
    report.write_text(page, encoding="utf-8")
