"""The OpenAI Agents SDK behind budgetproxy: an agent with a ``move`` tool plays one episode.

Chat-completions mode: ``OpenAIChatCompletionsModel`` with an ``AsyncOpenAI`` bound to the
episode's URL, so every model call the SDK makes is a turn of the episode. When the budget is
spent the proxy answers 403 ``turn_budget_exhausted`` and the run stops with the SDK's
``openai.PermissionDeniedError``; the harness then reports the outcome. Needs
``pip install openai-agents``. See examples/README.md for starting a proxy.

    BUDGETPROXY_URL=http://127.0.0.1:8080 python examples/agents_sdk.py --budget 10
"""

from __future__ import annotations

import argparse
import asyncio
import os
from typing import Literal

import openai
from agents import (
    Agent,
    MaxTurnsExceeded,
    ModelSettings,
    OpenAIChatCompletionsModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)

from budgetproxy.client import AsyncBudgetClient
from budgetproxy.demo.frozenlake import SYSTEM_PROMPT, TASKS, Game, observation


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--proxy", default=os.environ.get("BUDGETPROXY_URL", "http://127.0.0.1:8080"))
    p.add_argument("--model", default=os.environ.get("BUDGETPROXY_MODEL", "sim-recovering"))
    p.add_argument("--task", default="4x4", choices=[t.task_id for t in TASKS])
    p.add_argument("--budget", type=int, help="turns for this episode (default: the full budget)")
    p.add_argument("--disclosure", choices=["hidden", "disclosed"])
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


async def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    task = next(t for t in TASKS if t.task_id == args.task)
    set_tracing_disabled(True)  # keep traces local: the SDK would otherwise export them
    game = Game(task, seed=args.seed)

    @function_tool
    def move(direction: Literal["left", "down", "right", "up"]) -> str:
        """Move one cell on the lake."""
        if game.done:
            return "not made: the game is over"
        result = game.move(direction)
        if game.done:
            return f"{result.text()}. The game is over."
        return f"{result.text()}\n{observation(task, game.pos, [result])}"

    async with AsyncBudgetClient(args.proxy) as proxy:
        episode = await proxy.create_episode(
            budget=args.budget or task.max_turns, max_turns=task.max_turns, task_id=task.task_id,
            disclosure=args.disclosure, tags={"harness": "openai-agents"},
        )
        print(f"episode {episode.episode_id}: {episode.budget} of {task.max_turns} turns "
              f"({episode.tier}), {episode.disclosure}")
        agent = Agent(
            name="frozenlake",
            instructions=SYSTEM_PROMPT,
            tools=[move],
            model=OpenAIChatCompletionsModel(model=args.model,
                                             openai_client=episode.async_openai(max_retries=2)),
            model_settings=ModelSettings(parallel_tool_calls=False),
        )
        try:
            # The proxy enforces the budget; the SDK's own cap is only a backstop.
            result = await Runner.run(agent, observation(task, game.pos, []),
                                      max_turns=4 * task.max_turns)
            print(f"agent: {result.final_output}")
        except openai.PermissionDeniedError as exc:
            if exc.code != "turn_budget_exhausted":
                raise
            print("the proxy refused the next turn: the budget is spent")
        except MaxTurnsExceeded:
            print("the SDK's own turn cap stopped the run")
        game.close()
        state = await episode.report(success=game.won)
    print(f"{'won' if game.won else 'did not win'}; the proxy recorded {state['turns_used']} "
          f"turns, end reason {state['end_reason']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
