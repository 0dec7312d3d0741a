"""The demo's token arm: budget-aware under a token budget, hidden vs disclosed, on its own proxy.

Each task gets a token budget (input + output tokens, summed over the episode's calls, as the
simulated model reports them) worth ``calls_per_cell`` one-move calls per cell of the map's
shortest path, and its full turn budget, so that tokens, not turns, are what run out. The arm
runs on a proxy of its own whose disclosure template tells the agent its tokens
(``{tokens_remaining}``), logging to OUT/trajectories-tokens; the budget-aware policy reads that
line and paces itself (demo/policies.py). Its claim is ``analyze --compare
disclosure=disclosed,hidden`` on those logs at the full turn budget.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from budgetproxy.demo.agents import EpisodePlan
from budgetproxy.demo.frozenlake import MOVE_TOOL, SYSTEM_PROMPT, Task, observation
from budgetproxy.demo.policies import distances
from budgetproxy.demo.tokens import prompt_tokens, reply_tokens

POLICY = "budget-aware"
ARMS = ("hidden", "disclosed")
TEMPLATE = "[Token budget] {tokens_remaining} tokens remain of {tokens_total}."
TIER = 100  # the full turn budget: the token budget is the one that binds
LOGS = "trajectories-tokens"


def token_budget(task: Task, calls_per_cell: float) -> int:
    """Tokens of round(calls_per_cell × shortest path) one-move calls from the start, each
    call's prompt one turn longer than the one before."""
    first = [{"role": "system", "content": SYSTEM_PROMPT},
             {"role": "user", "content": observation(task, task.start, [])}]
    prompt = prompt_tokens(first, [MOVE_TOOL])
    growth = prompt_tokens(first[1:2]) + reply_tokens(1) + 8  # the reply, its tool result, a view
    calls = max(1, round(calls_per_cell * distances(task.rows, task.goal)[task.start]))
    return sum(prompt + i * growth + reply_tokens(1) for i in range(calls))


def plan_token_episodes(
    tasks: tuple[Task, ...], k: int, calls_per_cell: float, seed_of: Any
) -> list[EpisodePlan]:
    """k episodes per task and arm; both arms of an episode index share its seed (same ice)."""
    return [
        EpisodePlan(task, POLICY, task.max_turns, arm, seed_of(task.task_id, "tokens", i),  # type: ignore[arg-type]
                    run="tokens", tier=TIER, token_budget=token_budget(task, calls_per_cell))
        for task in tasks for i in range(k) for arm in ARMS
    ]


def proxy_overrides(out: Path) -> dict[str, Any]:
    """What the token arm's proxy changes in the demo's config: its logs and its template."""
    return {"trajectories": {"dir": str(out / LOGS)},
            "disclosure": {"mode": "hidden", "template": TEMPLATE}}


def analyze_args(out: Path, ks: str, seed: int) -> list[str]:
    """`budgetproxy analyze` on the arm's logs: the paired disclosed − hidden difference."""
    return [str(out / LOGS), "--k", ks, "--by", "policy", "--tiers", str(TIER),
            "--compare", "disclosure=disclosed,hidden", "--seed", str(seed)]
