"""A plain openai-SDK harness behind budgetproxy: one FrozenLake episode, its outcome reported.

The harness creates an episode on the proxy, talks to the model through an ``openai.OpenAI``
bound to the episode's URL (every call is a turn), stops when the proxy refuses a turn past
the budget, and reports success or failure. See examples/README.md for starting a proxy.

    BUDGETPROXY_URL=http://127.0.0.1:8080 python examples/openai_harness.py --budget 8
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import openai

from budgetproxy.client import BudgetClient
from budgetproxy.demo.agents import run_moves
from budgetproxy.demo.frozenlake import MOVE_TOOL, SYSTEM_PROMPT, TASKS, Game, observation


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--proxy", default=os.environ.get("BUDGETPROXY_URL", "http://127.0.0.1:8080"))
    p.add_argument("--model", default=os.environ.get("BUDGETPROXY_MODEL", "sim-careful"))
    p.add_argument("--task", default="4x4-slippery", choices=[t.task_id for t in TASKS])
    p.add_argument("--budget", type=int, help="turns for this episode (default: the full budget)")
    p.add_argument("--disclosure", choices=["hidden", "disclosed"])
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def assistant_message(message: Any) -> dict[str, Any]:
    """The reply as a message to send back next turn."""
    out: dict[str, Any] = {"role": "assistant", "content": message.content}
    if message.tool_calls:
        out["tool_calls"] = [
            {"id": c.id, "type": "function",
             "function": {"name": c.function.name, "arguments": c.function.arguments}}
            for c in message.tool_calls
        ]
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    task = next(t for t in TASKS if t.task_id == args.task)
    with BudgetClient(args.proxy) as proxy:
        episode = proxy.create_episode(
            budget=args.budget or task.max_turns, max_turns=task.max_turns, task_id=task.task_id,
            disclosure=args.disclosure, tags={"harness": "openai-sdk"},
        )
        print(f"episode {episode.episode_id}: {episode.budget} of {task.max_turns} turns "
              f"({episode.tier}), {episode.disclosure}")
        game = Game(task, seed=args.seed)
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": observation(task, game.pos, [])},
        ]
        turns = 0
        with episode.openai() as llm:
            while not game.done:
                try:
                    reply = llm.chat.completions.create(
                        model=args.model, messages=messages, tools=[MOVE_TOOL], seed=args.seed,
                    )
                except openai.PermissionDeniedError as exc:
                    if exc.code != "turn_budget_exhausted":
                        raise
                    print("the proxy refused the next turn: the budget is spent")
                    break
                turns += 1
                message = reply.choices[0].message
                messages.append(assistant_message(message))
                if not message.tool_calls:
                    break  # the model answered in words instead of moving
                tool_messages, made = run_moves(game, list(message.tool_calls))
                messages += tool_messages
                if not game.done:
                    messages.append({"role": "user", "content": observation(task, game.pos, made)})
        game.close()
        state = episode.report(success=game.won, success_turn=turns if game.won else None)
    print(f"{'won' if game.won else 'did not win'} in {turns} turns; the proxy recorded "
          f"{state['turns_used']} turns, end reason {state['end_reason']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
