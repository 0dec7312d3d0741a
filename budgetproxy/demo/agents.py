"""FrozenLake agents: one episode per attempt, model calls through the proxy, outcome reported.

An agent creates its episode with the episode API, talks to the model through the official
``openai`` client bound to the episode's path-prefix URL, runs the ``move`` tool calls of each
reply on gymnasium's FrozenLake-v1, and reports success or failure when the game ends or the
proxy refuses a turn because a budget (turns, or tokens where the plan sets one) is spent.
It never tells the model its budget: in the disclosed arm the proxy does that.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from budgetproxy.demo.frozenlake import (
    DIRECTIONS,
    MOVE_TOOL,
    MOVES_PER_TURN,
    SYSTEM_PROMPT,
    Game,
    MoveResult,
    Task,
    min_turns,
    observation,
)

if TYPE_CHECKING:
    import openai

    from budgetproxy.client import AsyncBudgetClient

Arm = Literal["hidden", "disclosed"]


@dataclass(frozen=True)
class EpisodePlan:
    """One attempt to run: which map, policy, budget and arm."""

    task: Task
    policy: str  # a key of policies.POLICIES; the model is "sim-" + policy
    budget: int | None  # None: the proxy draws it (BudgetMix)
    disclosure: Arm
    seed: int  # seeds the game's slides and the model's sampling (the request's `seed`)
    run: str = "tiers"  # "tiers" | "budgetmix"
    group: str | None = None
    tier: int | None = None  # percent of max_turns, for tier runs
    token_budget: int | None = None  # input + output tokens, for the token runs
    experiment: str | None = None  # a live experiment to join: the proxy picks the arm
    step: int | None = None  # the training checkpoint, for the dynamics run (tag "step")

    @property
    def model(self) -> str:
        return f"sim-{self.policy}"


@dataclass
class EpisodeResult:
    """How an attempt went, as the agent saw it."""

    plan: EpisodePlan
    episode_id: str
    budget: int
    won: bool
    turns: int
    moves: int
    fell: bool
    exhausted: bool  # the proxy refused a turn: a budget was spent
    tokens: int = 0  # input + output tokens the model reported, over the episode


def _assistant_message(message: Any) -> dict[str, Any]:
    calls = [
        {"id": c.id, "type": "function",
         "function": {"name": c.function.name, "arguments": c.function.arguments}}
        for c in message.tool_calls or []
    ]
    out: dict[str, Any] = {"role": "assistant", "content": message.content}
    if calls:
        out["tool_calls"] = calls
    return out


def _direction(arguments: str) -> str | None:
    try:
        value = json.loads(arguments).get("direction")
    except (ValueError, AttributeError):
        return None
    return value if value in DIRECTIONS else None


def run_moves(game: Game, calls: list[Any]) -> tuple[list[dict[str, Any]], list[MoveResult]]:
    """Run one reply's moves in order, at most MOVES_PER_TURN; a slide stops the rest of the
    plan.

    Returns the tool messages (one per call, as the API requires) and the moves made.
    """
    tool_messages: list[dict[str, Any]] = []
    made: list[MoveResult] = []
    stopped: str | None = None
    for call in calls:
        direction = _direction(call.function.arguments)
        if stopped is not None:
            text = f"not made: {stopped}"
        elif len(made) == MOVES_PER_TURN:
            text = f"not made: at most {MOVES_PER_TURN} moves a turn"
        elif call.function.name != "move" or direction is None:
            text = "not made: call move with direction left, down, right or up"
        else:
            result = game.move(direction)
            made.append(result)
            text = result.text()
            if game.done:
                stopped = "the game is over"
            elif result.slid:
                stopped = "the plan stopped when the ice made you slide"
        tool_messages.append({"role": "tool", "tool_call_id": call.id, "content": text})
    return tool_messages, made


async def play(
    proxy: AsyncBudgetClient, llm: openai.AsyncOpenAI, plan: EpisodePlan
) -> EpisodeResult:
    """Play one episode through the proxy and report its outcome."""
    import openai
    from openai.types.chat import ChatCompletion

    task = plan.task
    episode = await proxy.create_episode(
        budget=plan.budget,
        max_turns=task.max_turns,
        task_id=task.task_id,
        group=plan.group,
        disclosure=plan.disclosure,
        tags={"policy": plan.policy, "run": plan.run,
              **({} if plan.step is None else {"step": plan.step})},
        token_budget=plan.token_budget,
        experiment=plan.experiment,
        min_turns=min_turns(task),  # the same field X-Episode-Min-Turns sets
    )
    client = episode.async_openai(like=llm)
    game = Game(task, plan.seed)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": observation(task, game.pos, [])},
    ]
    turns = tokens = 0
    exhausted = False
    try:
        while not game.done:
            try:
                # The typed `chat.completions.create` re-walks the whole history on every call,
                # which dominates a demo of thousands of turns; the client's documented
                # low-level `post` sends the same request through the same transport.
                reply = await client.post(
                    "/chat/completions",
                    body={"model": plan.model, "messages": messages, "tools": [MOVE_TOOL],
                          "seed": plan.seed},
                    cast_to=ChatCompletion,
                )
            except openai.PermissionDeniedError as exc:
                if exc.code not in ("turn_budget_exhausted", "token_budget_exhausted"):
                    raise
                exhausted = True
                break
            turns += 1
            tokens += reply.usage.total_tokens if reply.usage is not None else 0
            message = reply.choices[0].message
            messages.append(_assistant_message(message))
            tool_messages, made = run_moves(game, list(message.tool_calls or []))
            messages.extend(tool_messages)
            if not game.done:
                messages.append({"role": "user", "content": observation(task, game.pos, made)})
    finally:
        game.close()
    fell = game.done and not game.won
    await episode.report(
        success=game.won,
        reward=1.0 if game.won else 0.0,
        success_turn=turns if game.won else None,
        metadata={"moves": game.moves, "fell_in_hole": fell},
    )
    return EpisodeResult(
        plan=plan, episode_id=episode.episode_id, budget=int(episode.budget or 0),
        won=game.won, turns=turns, moves=game.moves, fell=fell, exhausted=exhausted,
        tokens=tokens,
    )
