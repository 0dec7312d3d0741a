"""The demo's live experiment: hidden vs disclosed vs a mis-announced budget, arms by the proxy.

The budget-aware policy plays the 8x8 map at a quarter of its full budget (12 of 48 turns),
too few for its one-move-a-turn default pace. Each episode joins the experiment
(``experiment`` on ``POST /v1/episodes``) and the proxy draws its arm: ``hidden`` (nothing
said), ``disclosed`` (the true budget in the prompt) or ``told-full`` (the prompt claims the
full 48 turns). The proxy logs to OUT/trajectories-experiment; afterwards the logs are read
back after every episode, in finishing order, to show when the experiment could have stopped
and with what (what GET /v1/experiments/{name} said at that point).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from budgetproxy.demo.agents import EpisodePlan
from budgetproxy.demo.frozenlake import TASKS, Task

NAME = "budget-told"
POLICY = "budget-aware"
TASK: Task = TASKS[2]  # 8x8, not slippery: 14 cells from start to goal
TIER = 25
LOGS = "trajectories-experiment"


def experiment(task: Task = TASK) -> dict[str, Any]:
    """The config block: three arms, episodes as units (paired within the task)."""
    return {"name": NAME, "unit": "episode", "alpha": 0.05, "min_effect": 0.2,
            "arms": [{"name": "hidden", "disclosure": "hidden"},
                     {"name": "disclosed", "disclosure": "disclosed"},
                     {"name": "told-full", "disclosure": "disclosed",
                      "announced_budget": task.max_turns}]}


def plan_experiment_episodes(n: int, budget: int,
                             seed_of: Callable[..., int]) -> list[EpisodePlan]:
    return [EpisodePlan(TASK, POLICY, budget, "hidden", seed_of(TASK.task_id, NAME, i),
                        run="experiment", tier=TIER, experiment=NAME) for i in range(n)]


def proxy_overrides(out: Path) -> dict[str, Any]:
    """What the experiment's proxy changes in the demo's config: its logs and the experiment."""
    return {"trajectories": {"dir": str(out / LOGS)}, "budget": {"sampler": "none"},
            "experiments": [experiment()]}


def stopping_points(logs: Path) -> tuple[dict[str, Any] | None, list[str]]:
    """The final view from the logs, and for each comparison the first episode after which
    it could have stopped (read after every episode), as lines to print."""
    from budgetproxy.analysis.experiment import read_experiment, read_finished
    from budgetproxy.analysis.load import discover
    from budgetproxy.core.experiment import first_stops

    files = discover([str(logs)]).jsonl
    final = read_experiment(files, NAME)
    if final is None:
        return None, [f"Live experiment {NAME}: no records found in {logs}"]
    exp, finished = read_finished(files, NAME)
    lines = [f"Live experiment {NAME!r} ({TASK.task_id}, budget-aware policy, "
             f"{TIER}% budget; arms assigned by the proxy, read after every episode):"]
    for arm in final["arms"]:
        lines.append(f"  {arm['name']:<10} {arm['successes']:>4} / {arm['episodes']:<4} won")
    stops = first_stops(exp, finished)
    for c in final["comparisons"]:
        at = stops.get((c["a"], c["b"]))
        d = c["difference"]
        if at is None:
            est = "-" if d["estimate"] is None else f"{d['estimate']:+.2f}"
            lines.append(f"  {c['a']} - {c['b']}: no decision yet; now {est} "
                         f"[{d['cs_low']:+.2f}, {d['cs_high']:+.2f}]")
            continue
        n, then = at
        dd = then["difference"]
        lines.append(f"  {c['a']} - {c['b']}: could stop after {n} episodes with "
                     f"{then['decision']} (difference {dd['estimate']:+.2f}, always-valid "
                     f"interval [{dd['cs_low']:+.2f}, {dd['cs_high']:+.2f}])")
    return final, lines
