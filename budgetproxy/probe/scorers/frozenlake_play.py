"""FrozenLake continuations: a policy plays on from a probe state to the end of a new episode."""

from __future__ import annotations

from typing import Any

from budgetproxy.demo.agents import run_moves
from budgetproxy.demo.frozenlake import MOVE_TOOL, TASKS, Game, Task, observation
from budgetproxy.demo.policies import Observation, parse_observation
from budgetproxy.probe.sampling import assistant_message
from budgetproxy.probe.states import State, message_text


def _task(state: State, obs: Observation) -> Task:
    """The shipped map the state names, else one built from what its observation shows."""
    for task in TASKS:
        if task.task_id == state.task_id and task.rows == obs.rows:
            return task
    return Task(state.task_id, obs.rows, slippery=obs.slide > 0,
                max_turns=state.max_turns or 100, success_rate=1 - obs.slide)


def _observed(state: State) -> Observation:
    for m in reversed(state.conversation):
        if m.get("role") in ("user", "tool"):
            obs = parse_observation(message_text(m))
            if obs is not None:
                return obs
    raise ValueError("no FrozenLake observation in this state")


async def continue_episode(state: State, *, model: str, proxy: Any, llm: Any, seed: int,
                           tags: dict[str, Any]) -> bool:
    """Play `model` on from the state's real position with the turns its episode had left;
    True when it reaches the goal. The game's ice is seeded by `seed`."""
    import openai
    from openai.types.chat import ChatCompletion

    obs = _observed(state)
    task = _task(state, obs)
    episode = await proxy.create_episode(
        budget=max(1, state.remaining or task.max_turns), max_turns=state.max_turns,
        disclosure=state.disclosure if state.disclosure in ("hidden", "disclosed") else None,
        tags=tags)
    client = episode.async_openai(like=llm)
    game = Game(task, seed)
    game.pos = obs.position
    game._env.unwrapped.s = obs.position[0] * len(task.rows[0]) + obs.position[1]
    messages: list[dict[str, Any]] = [dict(m) for m in state.conversation]
    turns = 0
    try:
        while not game.done:
            try:
                reply = await client.post(
                    "/chat/completions",
                    body={"model": model, "messages": messages, "tools": [MOVE_TOOL],
                          "seed": seed},
                    cast_to=ChatCompletion)
            except openai.PermissionDeniedError as exc:
                if exc.code != "turn_budget_exhausted":
                    raise
                break
            turns += 1
            message = reply.choices[0].message
            messages.append(assistant_message(message))
            tool_messages, made = run_moves(game, list(message.tool_calls or []))
            messages.extend(tool_messages)
            if not game.done:
                messages.append({"role": "user", "content": observation(task, game.pos, made)})
    finally:
        game.close()
    await episode.report(success=game.won, reward=1.0 if game.won else 0.0,
                         success_turn=turns if game.won else None)
    return game.won
