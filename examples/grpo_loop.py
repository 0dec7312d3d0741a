"""A GRPO-style loop through budgetproxy (no GPU, no real training): K rollouts per task under
BudgetMix, wait for each group, read its advantages and trajectories, export for a trainer.

Per step and task the loop declares a group of K (POST /v1/groups), creates K episodes in it
(the proxy, run with ``budget.sampler: budgetmix``, draws one budget for the group and
discloses it), plays them concurrently against FrozenLake, reports each outcome, long-polls
GET /v1/groups/{task}/{group}?wait=true for the rewards after the budget rule
(``reward.on_exhausted: zero`` in examples/proxy.yaml) and the group's advantages, and reads
every episode's trajectory (GET /v1/episodes/{id}/trajectory): the messages the model saw and,
behind a vLLM or SGLang upstream with ``capture_tokens: true``, the token ids it sampled. The
"update" only prints what a trainer would weigh: sampled tokens times advantage. With
``--logs DIR --out DIR`` it ends with ``budgetproxy export`` of the proxy's logs.

    BUDGETPROXY_URL=http://127.0.0.1:8080 python examples/grpo_loop.py --k 4 --steps 2
"""

from __future__ import annotations

import argparse
import asyncio
import os
import uuid
from typing import Any

import httpx
import openai
from rl_rollout_group import rollout  # the FrozenLake rollout beside this file

from budgetproxy.client import AsyncBudgetClient
from budgetproxy.demo.frozenlake import TASKS


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--proxy", default=os.environ.get("BUDGETPROXY_URL", "http://127.0.0.1:8080"))
    p.add_argument("--model", default=os.environ.get("BUDGETPROXY_MODEL", "sim-budget-aware"))
    p.add_argument("--tasks", default="4x4-slippery,8x8",
                   help="comma-separated FrozenLake task ids")
    p.add_argument("--k", type=int, default=4, help="rollouts per group")
    p.add_argument("--steps", type=int, default=2, help="training steps")
    p.add_argument("--logs", help="the proxy's trajectory folder, to export from")
    p.add_argument("--out", help="where `budgetproxy export` writes episodes.parquet")
    return p.parse_args(argv)


async def run_group(proxy: AsyncBudgetClient, api: httpx.AsyncClient, llm: openai.AsyncOpenAI,
                    task: Any, group: str, k: int, model: str) -> dict[str, Any]:
    r = await api.post("/v1/groups", json={"task_id": task.task_id, "group": group, "size": k})
    r.raise_for_status()
    episodes = [await proxy.create_episode(max_turns=task.max_turns, task_id=task.task_id,
                                           group=group, disclosure="disclosed",
                                           tags={"harness": "grpo-loop"}) for _ in range(k)]
    outcomes = await asyncio.gather(*(rollout(e, llm, task, model, seed=i)
                                      for i, e in enumerate(episodes)))
    for episode, (reward, turns) in zip(episodes, outcomes, strict=True):
        await episode.report(success=reward > 0, reward=reward,
                             success_turn=turns if reward > 0 else None)
    r = await api.get(f"/v1/groups/{task.task_id}/{group}",
                      params={"wait": "true", "timeout_s": 60})
    r.raise_for_status()
    view: dict[str, Any] = r.json()
    return view


async def sampled_tokens(api: httpx.AsyncClient, episode_id: str) -> tuple[int, int | None]:
    """Turns of an episode's trajectory and the tokens the model sampled in them (None when
    the upstream returned no token ids)."""
    r = await api.get(f"/v1/episodes/{episode_id}/trajectory")
    r.raise_for_status()
    turns = r.json()["turns"]
    ids = [t.get("completion_token_ids") for t in turns]
    return len(turns), (sum(len(i) for i in ids) if ids and all(ids) else None)


async def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    tasks = [next(t for t in TASKS if t.task_id == name) for name in args.tasks.split(",")]
    run = uuid.uuid4().hex[:6]
    async with (
        AsyncBudgetClient(args.proxy) as proxy,
        httpx.AsyncClient(base_url=proxy.proxy_url, timeout=90) as api,
        openai.AsyncOpenAI(base_url=f"{proxy.proxy_url}/v1",
                           api_key=os.environ.get("OPENAI_API_KEY", "unused")) as llm,
    ):
        for step in range(args.steps):
            for task in tasks:
                group = f"{run}-step{step}"
                view = await run_group(proxy, api, llm, task, group, args.k, args.model)
                budget = {e["budget"] for e in view["episodes"]}
                print(f"step {step} {task.task_id} group {group}: done={view['done']} "
                      f"budget {sorted(budget)} of {task.max_turns}")
                weight = 0.0
                for e in view["episodes"]:
                    turns, tokens = await sampled_tokens(api, e["episode_id"])
                    shown = "no token ids" if tokens is None else f"{tokens} sampled tokens"
                    print(f"  {e['episode_id']}: {e['end_reason']:<9} reward {e['reward']:.1f} "
                          f"advantage {e['advantage']:+.3f} ({turns} turns, {shown})")
                    weight += e["advantage"] * (tokens or turns)
                print(f"  policy-gradient weight of the group (sum advantage x tokens): "
                      f"{weight:+.3f}")
    if args.logs and args.out:
        from budgetproxy.cli import main as cli

        await asyncio.sleep(0.5)  # the proxy's log writer runs beside the calls
        return cli(["export", args.logs, "--out", args.out, "--on-exhausted", "zero"])
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
