"""An RL rollout group behind budgetproxy: K episodes share one BudgetMix budget, GRPO-style.

Each of the K rollouts creates its episode with the same ``task_id`` and ``group`` and no
budget, so the proxy (run with ``budget.sampler: budgetmix``, as in examples/proxy.yaml) draws
one budget for the whole group from the 10% grid of the task's full budget, and discloses it
in the prompt. Rollouts run concurrently; running out of turns earns zero reward. Each
episode's outcome and reward go back to the proxy, so ``budgetproxy analyze`` sees them.

    BUDGETPROXY_URL=http://127.0.0.1:8080 python examples/rl_rollout_group.py --k 8
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import uuid
from typing import Any

import openai

from budgetproxy.client import AsyncBudgetClient, AsyncEpisode
from budgetproxy.demo.agents import run_moves
from budgetproxy.demo.frozenlake import MOVE_TOOL, SYSTEM_PROMPT, TASKS, Game, Task, observation


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--proxy", default=os.environ.get("BUDGETPROXY_URL", "http://127.0.0.1:8080"))
    p.add_argument("--model", default=os.environ.get("BUDGETPROXY_MODEL", "sim-budget-aware"))
    p.add_argument("--task", default="4x4-slippery", choices=[t.task_id for t in TASKS])
    p.add_argument("--k", type=int, default=8, help="rollouts in the group")
    p.add_argument("--group", default=None, help="group name (default: a fresh one)")
    return p.parse_args(argv)


async def rollout(
    episode: AsyncEpisode, llm: openai.AsyncOpenAI, task: Task, model: str, seed: int
) -> tuple[float, int]:
    """One trajectory; returns its reward (1 for reaching the goal in budget) and turns."""
    client = episode.async_openai(like=llm)  # shares the connection pool
    game = Game(task, seed=seed)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": observation(task, game.pos, [])},
    ]
    turns = 0
    while not game.done:
        try:
            reply = await client.chat.completions.create(
                model=model, messages=messages, tools=[MOVE_TOOL], seed=seed,  # type: ignore[arg-type]
            )
        except openai.PermissionDeniedError as exc:
            if exc.code != "turn_budget_exhausted":
                raise
            break  # out of turns: zero reward
        turns += 1
        message = reply.choices[0].message
        calls = list(message.tool_calls or [])
        messages.append({"role": "assistant", "content": message.content, "tool_calls": [
            {"id": c.id, "type": "function",
             "function": {"name": c.function.name, "arguments": c.function.arguments}}
            for c in calls
        ]} if calls else {"role": "assistant", "content": message.content})
        if not calls:
            break
        tool_messages, made = run_moves(game, calls)
        messages += tool_messages
        if not game.done:
            messages.append({"role": "user", "content": observation(task, game.pos, made)})
    game.close()
    return (1.0 if game.won else 0.0), turns


async def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    task = next(t for t in TASKS if t.task_id == args.task)
    group = args.group or f"rollout-{uuid.uuid4().hex[:8]}"
    async with (
        AsyncBudgetClient(args.proxy) as proxy,
        openai.AsyncOpenAI(base_url=f"{proxy.proxy_url}/v1",
                           api_key=os.environ.get("OPENAI_API_KEY", "unused")) as llm,
    ):
        episodes = [
            await proxy.create_episode(max_turns=task.max_turns, task_id=task.task_id,
                                       group=group, disclosure="disclosed",
                                       tags={"harness": "rl-rollout"})
            for _ in range(args.k)
        ]
        budgets = sorted({e.budget for e in episodes if e.budget is not None})
        print(f"group {group} on {task.task_id}: budget {budgets} of {task.max_turns} turns "
              f"for all {args.k} rollouts ({episodes[0].tier}, {episodes[0].disclosure})")
        if budgets == [task.max_turns]:
            print("(the full budget: BudgetMix draws it too; if every run shows it, check "
                  "budget.sampler: budgetmix)")
        outcomes = await asyncio.gather(
            *(rollout(e, llm, task, args.model, seed=i) for i, e in enumerate(episodes))
        )
        rewards = [r for r, _ in outcomes]
        mean, spread = statistics.fmean(rewards), statistics.pstdev(rewards) or 1.0
        for episode, (reward, turns) in zip(episodes, outcomes, strict=True):
            advantage = (reward - mean) / spread  # what a GRPO update would weigh this by
            await episode.report(
                success=reward > 0, reward=reward, success_turn=turns if reward > 0 else None,
                metadata={"advantage": round(advantage, 4)},
            )
            print(f"  {episode.episode_id}: reward {reward:.0f} in {turns} turns, "
                  f"advantage {advantage:+.2f}")
    print(f"group success {sum(rewards):.0f}/{args.k}")
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
