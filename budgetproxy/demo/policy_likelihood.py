"""The simulated policies' exact probability of a reply, and the prompt_logprobs that carry it.

``policies.decide`` samples a plan; this module gives the probability it samples a given one,
by the same rules: the position it plans from (the real one, or after a slide the stale one
with chance 1 − ``recovery``), then each move a best move with chance ``step_accuracy``
(shared evenly among the best) or else one of the moves that cannot end in a hole, ``pace``
moves unless one ends on a hole or the goal. A closing or no-map text is the one the policy
says (probability 1). A reply the policy never gives gets probability ``FLOOR``, as a real
model gives every sequence some mass. The tests check these against ``decide``'s own sampling
frequencies.

The demo model server answers vLLM's ``prompt_logprobs`` with these numbers: the prompt's
tokens (as ``tokens.prompt_tokens`` counts them) get 0, the reply's first token the reply's
whole log-probability and its other tokens 0, so the reply's tokens sum to it exactly.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from budgetproxy.demo.frozenlake import DIRECTIONS, Pos, step_target
from budgetproxy.demo.policies import (
    Observation,
    PolicyParams,
    game_over,
    hole_chance,
    move_values,
    policy_for_model,
    situation,
)
from budgetproxy.demo.tokens import message_text, prompt_tokens, reply_tokens

FLOOR = 1e-9
NO_MAP = "I cannot find a FrozenLake map in this conversation."


def move_probability(obs: Observation, at: Pos, direction: str, accuracy: float) -> float:
    """P(the policy's next move from `at` is `direction`), as ``policies._choose`` draws it."""
    values = move_values(obs.rows, obs.slide).get(at)
    if values is None:
        return 1 / len(DIRECTIONS)
    top = max(values.values())
    best = [d for d in DIRECTIONS if values[d] >= top - 1e-9]
    safe = [d for d in DIRECTIONS
            if d not in best and hole_chance(obs.rows, at, d, obs.slide) == 0]
    if direction in best:
        return (accuracy if safe else 1.0) / len(best)
    return (1 - accuracy) / len(safe) if direction in safe else 0.0


def _path_probability(obs: Observation, start: Pos, plan: Sequence[str], pace: int,
                      accuracy: float) -> float:
    p, at = 1.0, start
    for i, direction in enumerate(plan):
        if i >= pace:
            return 0.0
        p *= move_probability(obs, at, direction, accuracy)
        at = step_target(obs.rows, at, direction)
        if obs.rows[at[0]][at[1]] in "HG":
            return p if i == len(plan) - 1 else 0.0
    return p if len(plan) == pace else 0.0


def plan_probability(params: PolicyParams, messages: Sequence[Mapping[str, Any]],
                     plan: Sequence[str], tools: Any = None) -> float:
    """P(``decide`` returns `plan`) for this prompt."""
    situ = situation(params, messages, tools)
    if situ is None:
        return 1.0 if not plan else 0.0
    obs, pace = situ
    starts = [(1.0, obs.position)]
    if obs.slid and obs.planned is not None:
        starts = [(params.recovery, obs.position), (1 - params.recovery, obs.planned)]
    return sum(w * _path_probability(obs, at, plan, pace, params.step_accuracy)
               for w, at in starts)


def directions(action: Mapping[str, Any]) -> list[str] | None:
    """The reply's moves, or None when it holds a call that is not a valid move."""
    out = []
    for call in action.get("tool_calls") or []:
        fn = (call.get("function") or {}) if isinstance(call, Mapping) else {}
        try:
            d = json.loads(fn.get("arguments") or "{}").get("direction")
        except (ValueError, AttributeError):
            return None
        if fn.get("name") != "move" or d not in DIRECTIONS:
            return None
        out.append(d)
    return out


def reply_logprob(params: PolicyParams, messages: Sequence[Mapping[str, Any]],
                  action: Mapping[str, Any], tools: Any = None) -> float:
    """log P(the policy answers `messages` with `action`), at least log FLOOR."""
    plan = directions(action)
    if plan is None:
        p = 0.0
    elif plan:
        p = 0.0 if game_over(messages) else plan_probability(params, messages, plan, tools)
    else:
        said = game_over(messages) or (NO_MAP if situation(params, messages, tools) is None
                                       else None)
        p = 1.0 if said is not None and message_text(action) == said else 0.0
    return math.log(max(p, FLOOR))


def prompt_logprobs(body: Mapping[str, Any]) -> list[Any] | None:
    """vLLM's prompt_logprobs for a request whose last message is the reply to score (None
    when the model is not simulated or the last message is not an assistant's)."""
    params = policy_for_model(str(body.get("model", "")))
    messages = [m for m in body.get("messages") or [] if isinstance(m, Mapping)]
    if params is None or not messages or messages[-1].get("role") != "assistant":
        return None
    *prefix, action = messages
    tools = body.get("tools")
    n_prompt = prompt_tokens(prefix, tools)
    calls = len(action.get("tool_calls") or [])
    n_reply = reply_tokens(calls, None if calls else message_text(action))
    lp = reply_logprob(params, prefix, action, tools)
    values = [0.0] * (n_prompt - 1) + [lp] + [0.0] * (n_reply - 1)
    zero = {"0": {"logprob": 0.0}}
    return [None, *(zero if v == 0.0 else {"0": {"logprob": v}} for v in values)]
