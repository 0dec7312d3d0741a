"""The demo's training dynamics: simulated checkpoints, their Pass@(K,T) and state diagnostics
per checkpoint, and the ceiling per budget.

Checkpoints (demo/policies.py `checkpoint_policy`) interpolate between careful (step 0) and
recovering (the last step). Each plays every map at its full budget, hidden, on a proxy of its
own logging to OUT/trajectories-dynamics (hidden episodes count at every tier up to their
budget, so one run gives every tier). Then `analyze --over step --ceiling` and `probe --over
step --b step=0` read those logs, and OUT/dynamics.json holds both results. The lines printed
claim a trend only where the intervals carry it and the few_tasks rule allows it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from budgetproxy.demo.agents import EpisodePlan
from budgetproxy.demo.frozenlake import Task
from budgetproxy.demo.policies import CHECKPOINT_STEPS

LOGS = "trajectories-dynamics"
DYNAMICS_FILE = "dynamics.json"
TIERS = "25,50,75,100"


def plan_checkpoint_episodes(
    tasks: Sequence[Task], k: int, seed_of: Callable[..., int]
) -> list[EpisodePlan]:
    """k hidden episodes per map and checkpoint at the full budget; checkpoints share seeds."""
    return [
        EpisodePlan(task, f"step-{step}", task.max_turns, "hidden",
                    seed_of(task.task_id, "dynamics", i), run="dynamics", tier=100, step=step)
        for task in tasks for i in range(k) for step in CHECKPOINT_STEPS
    ]


def proxy_overrides(out: Path) -> dict[str, Any]:
    return {"trajectories": {"dir": str(out / LOGS)}}


def analyze_args(out: Path, seed: int) -> list[str]:
    """`budgetproxy analyze` of the checkpoints: Pass@(1,T) per step, with the ceiling."""
    return [str(out / LOGS), "--over", "step", "--ceiling", "--k", "1", "--tiers", TIERS,
            "--seed", str(seed)]


def run_probe_over(traj: Path, proxy_url: str, *, states: int, samples: int,
                   seed: int) -> dict[str, Any]:
    """`probe --over step --b step=0` on the checkpoints' logs, actions after an injected
    slide included."""
    from budgetproxy.probe import ProbeOptions, load_scorer
    from budgetproxy.probe.over import run_probe_over as over

    opts = ProbeOptions(paths=[traj], a="", b=f"step={CHECKPOINT_STEPS[0]}",
                        scorer=load_scorer("frozenlake"), proxy=proxy_url, states=states,
                        samples=samples, inject="action", seed=seed)
    return asyncio.run(over(opts, "step", "run=dynamics"))


def write(out: Path, analysis: Mapping[str, Any], probe: Mapping[str, Any]) -> Path:
    path = out / DYNAMICS_FILE
    path.write_text(json.dumps({"analyze": analysis, "probe": probe}, indent=2,
                               ensure_ascii=False) + "\n", encoding="utf-8")
    return path


def _iv(value: float, low: float, high: float) -> str:
    return f"{100 * value:.0f}% [{100 * low:.0f}–{100 * high:.0f}]"


def _cell(point: Mapping[str, Any], tier: str) -> Mapping[str, Any] | None:
    return next((c for c in point["pass_at"] if c.get("tier") == tier and c["k"] == 1
                 and c["value"] is not None), None)


def _trend(first: Mapping[str, Any], last: Mapping[str, Any]) -> str:
    if first.get("few_tasks") or last.get("few_tasks"):
        return "too few maps to read a trend"
    if last["ci_low"] > first["ci_high"]:
        return "rises: the first and last intervals do not overlap"
    if last["ci_high"] < first["ci_low"]:
        return "falls: the first and last intervals do not overlap"
    return "no trend the intervals support (the first and last overlap)"


def _win_claim(view: Mapping[str, Any] | None, what: str) -> str:
    if not view or view.get("win_rate") is None:
        return f"{what}: no states to compare"
    # wins beside losses (ties apart): the net says which side wins more states
    net, low, high = view["net_win"], view["net_ci_low"], view["net_ci_high"]
    text = (f"{what} wins {_iv(view['win_rate'], view['ci_low'], view['ci_high'])}, ties "
            f"{100 * view['tie_rate']:.0f}%, net {100 * net:+.0f} points [{100 * low:+.0f} to "
            f"{100 * high:+.0f}]")
    if view.get("few_tasks"):
        return text + f" ({view['n_tasks']} maps: too few to name a winner)"
    if high < 0:
        return text + ", worse than step 0"
    if low > 0:
        return text + ", better than step 0"
    return text + ", no difference the interval supports"


def claims(analysis: Mapping[str, Any], probe: Mapping[str, Any]) -> list[str]:
    """The dynamics and the ceiling, each figure with its 95% interval."""
    points = analysis.get("over") or []
    steps = [p["value"] for p in points]
    lines = [f"Training dynamics (simulated checkpoints step {', '.join(steps)}: careful "
             "moving to recovering; hidden, full budget, read at every tier; 95% CIs over "
             "maps):"]
    for tier in ("25%", "100%"):
        cells = [(p["value"], c) for p in points if (c := _cell(p, tier)) is not None]
        if len(cells) < 2:
            continue
        series = ", ".join(f"step {v} {_iv(c['value'], c['ci_low'], c['ci_high'])}"
                           for v, c in cells)
        lines.append(f"- Pass@1 at {tier} of the budget: {series}; "
                     f"{_trend(cells[0][1], cells[-1][1])}.")
    for key, what in (("single_step", "single steps"), ("error_states", "after a slide")):
        parts = [_win_claim(p.get(key), f"step {p['value']}") for p in probe.get("over") or []]
        if parts:
            lines.append(f"- Win rate over step 0, {what}: " + "; ".join(parts) + ".")
    lines += _ceiling_claim(points)
    return lines


def _ceiling_claim(points: Sequence[Mapping[str, Any]]) -> list[str]:
    """At the tightest tier: can every map still be solved, and how far is each checkpoint?"""
    cells: list[tuple[str, Mapping[str, Any]]] = []
    for p in points:
        c = _cell(p, "25%")
        if c is not None and c.get("ceiling") is not None:
            cells.append((p["value"], c))
    if not cells:
        return []
    ceiling = cells[0][1]
    source = ("each map's shortest safe path, sent as X-Episode-Min-Turns"
              if ceiling["ceiling_source"] == "min_turns" else "the shortest successes observed")
    if any(c.get("few_tasks") for _, c in cells):
        return [f"- The ceiling at 25% of the budget: {100 * ceiling['ceiling']:.0f}% of the "
                f"maps can be solved within it at all (from {source}); "
                f"{ceiling['n_tasks']} maps: too few to read the headroom."]
    gaps = ", ".join(
        f"step {v} {100 * c['headroom']:.0f} points [{100 * c['headroom_ci_low']:.0f}–"
        f"{100 * c['headroom_ci_high']:.0f}]" for v, c in cells)
    share = f"{100 * ceiling['ceiling']:.0f}% of the maps"
    return [f"- The ceiling at 25% of the budget: {share} can be solved within it at all (from "
            f"{source}); headroom (ceiling − Pass@1): {gaps}. "
            + ("The tight budget is not simply too tight: the missing successes are the "
               "policies'." if ceiling["ceiling"] == 1 else "")]


def add_to_report(report: Path, probe: Mapping[str, Any]) -> None:
    """The probe-per-checkpoint section, appended to the demo's HTML report."""
    from budgetproxy.demo.probe import append_section
    from budgetproxy.probe.over import html_over

    if probe.get("over"):
        append_section(report, html_over(probe))
