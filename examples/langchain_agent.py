"""LangChain behind budgetproxy: ``ChatOpenAI`` with the episode id in a default header.

``ChatOpenAI(base_url=<proxy>/v1, default_headers={"X-Episode-Id": ...})`` makes every call a
turn of the episode (``episode.headers`` is that header). The loop binds the ``move`` tool,
runs the moves, and stops when the proxy refuses a turn past the budget (the underlying
``openai.PermissionDeniedError``). Needs ``pip install langchain-openai``. See
examples/README.md for starting a proxy.

    BUDGETPROXY_URL=http://127.0.0.1:8080 python examples/langchain_agent.py --budget 10
"""

from __future__ import annotations

import argparse
import os

import openai
from langchain_core.messages import BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_openai import ChatOpenAI

from budgetproxy.client import BudgetClient
from budgetproxy.demo.frozenlake import (
    DIRECTIONS,
    MOVE_TOOL,
    SYSTEM_PROMPT,
    TASKS,
    Game,
    observation,
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--proxy", default=os.environ.get("BUDGETPROXY_URL", "http://127.0.0.1:8080"))
    p.add_argument("--model", default=os.environ.get("BUDGETPROXY_MODEL", "sim-careful"))
    p.add_argument("--task", default="8x8", choices=[t.task_id for t in TASKS])
    p.add_argument("--budget", type=int, help="turns for this episode (default: the full budget)")
    p.add_argument("--disclosure", choices=["hidden", "disclosed"])
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    task = next(t for t in TASKS if t.task_id == args.task)
    with BudgetClient(args.proxy) as proxy:
        episode = proxy.create_episode(
            budget=args.budget or task.max_turns, max_turns=task.max_turns, task_id=task.task_id,
            disclosure=args.disclosure, tags={"harness": "langchain"},
        )
        print(f"episode {episode.episode_id}: {episode.budget} of {task.max_turns} turns "
              f"({episode.tier}), {episode.disclosure}")
        llm = ChatOpenAI(
            model=args.model,
            base_url=f"{proxy.proxy_url}/v1",
            api_key=os.environ.get("OPENAI_API_KEY", "unused"),  # type: ignore[arg-type]
            default_headers=episode.headers,
            max_retries=2,
            seed=args.seed,
        ).bind_tools([MOVE_TOOL])
        game = Game(task, seed=args.seed)
        messages: list[BaseMessage] = [
            SystemMessage(SYSTEM_PROMPT), HumanMessage(observation(task, game.pos, []))
        ]
        turns = 0
        while not game.done:
            try:
                reply = llm.invoke(messages)
            except openai.PermissionDeniedError as exc:
                if exc.code != "turn_budget_exhausted":
                    raise
                print("the proxy refused the next turn: the budget is spent")
                break
            turns += 1
            messages.append(reply)
            calls = getattr(reply, "tool_calls", [])
            if not calls:
                break  # the model answered in words instead of moving
            made, stopped = [], ""
            for call in calls:
                direction = call["args"].get("direction")
                if stopped:
                    text = f"not made: {stopped}"
                elif direction not in DIRECTIONS:
                    text = "not made: call move with direction left, down, right or up"
                else:
                    result = game.move(direction)
                    made.append(result)
                    text = result.text()
                    stopped = "the game is over" if game.done else (
                        "the plan stopped when the ice made you slide" if result.slid else "")
                messages.append(ToolMessage(text, tool_call_id=call["id"]))
            if not game.done:
                messages.append(HumanMessage(observation(task, game.pos, made)))
        game.close()
        state = episode.report(success=game.won, success_turn=turns if game.won else None)
    print(f"{'won' if game.won else 'did not win'} in {turns} turns; the proxy recorded "
          f"{state['turns_used']} turns, end reason {state['end_reason']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
