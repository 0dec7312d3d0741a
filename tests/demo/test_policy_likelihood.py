"""The simulated policies' reply probabilities: exact against decide's own sampling, summing
to one over the plans it gives, and carried by the model server's prompt_logprobs."""

from __future__ import annotations

import json
import math
import random
from collections import Counter
from typing import Any

import pytest

from budgetproxy.demo import policies as po
from budgetproxy.demo.frozenlake import SYSTEM_PROMPT, TASKS, MoveResult, observation
from budgetproxy.demo.model_server import completion
from budgetproxy.demo.policy_likelihood import (
    FLOOR,
    plan_probability,
    prompt_logprobs,
    reply_logprob,
)
from budgetproxy.demo.tokens import prompt_tokens, reply_tokens

PLAIN_4, SLIPPERY_4, PLAIN_8, _ = TASKS


def messages(text: str) -> list[dict[str, Any]]:
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": text}]


def after_slide() -> list[dict[str, Any]]:
    """A slippery 4x4 state whose last move slid: the stale-plan branch is live."""
    slid = MoveResult("right", (0, 0), (1, 0), slid=True, cell="F")
    return messages(observation(SLIPPERY_4, (1, 0), [slid]))


STATES = {
    "start-4x4": lambda: messages(observation(PLAIN_4, PLAIN_4.start, [])),
    "after-slide": after_slide,
    "8x8-middle": lambda: messages(observation(PLAIN_8, (3, 3), [])),
}


@pytest.mark.parametrize("state", sorted(STATES))
@pytest.mark.parametrize("name", ["careful", "recovering"])
def test_probabilities_match_decides_frequencies_and_sum_to_one(name: str, state: str) -> None:
    params = po.POLICIES[name]
    msgs = STATES[state]()
    rng = random.Random(7)
    n = 6000
    seen = Counter(tuple(po.decide(params, msgs, rng)) for _ in range(n))
    probs = {plan: plan_probability(params, msgs, plan) for plan in seen}
    assert sum(probs.values()) == pytest.approx(1.0, abs=1e-9)  # decide gives no other plan
    for plan, count in seen.items():
        p = probs[plan]
        assert abs(count / n - p) <= 4 * math.sqrt(p * (1 - p) / n) + 1e-3, plan


def test_a_reply_the_policy_never_gives_gets_the_floor_and_texts_are_certain() -> None:
    msgs = STATES["start-4x4"]()
    never = {"role": "assistant", "tool_calls": [
        {"id": "x", "type": "function", "function": {"name": "jump", "arguments": "{}"}}]}
    assert reply_logprob(po.POLICIES["careful"], msgs, never) == math.log(FLOOR)
    junk = {"role": "assistant", "tool_calls": ["not a call"]}
    assert reply_logprob(po.POLICIES["careful"], msgs, junk) == math.log(FLOOR)
    over = [*msgs[:-1], {"role": "user", "content": "You reached the goal. The game is over."}]
    said = {"role": "assistant", "content": "I reached the goal."}
    assert reply_logprob(po.POLICIES["careful"], over, said) == 0.0


def test_the_model_server_carries_the_replys_logprob_in_prompt_logprobs() -> None:
    msgs = STATES["after-slide"]()
    reply = completion(3, {"model": "sim-recovering", "messages": msgs, "seed": 5})
    assert reply is not None
    action = reply["choices"][0]["message"]
    moves = [json.loads(c["function"]["arguments"])["direction"] for c in action["tool_calls"]]
    body = {"model": "sim-careful", "messages": [*msgs, action], "prompt_logprobs": 0}
    entries = prompt_logprobs(body)
    assert entries is not None
    start = prompt_tokens(msgs)
    assert len(entries) == start + reply_tokens(len(moves))
    total = sum(next(iter(e.values()))["logprob"] for e in entries[start:])
    want = math.log(plan_probability(po.POLICIES["careful"], msgs, moves))
    assert total == pytest.approx(want, abs=1e-12)
    assert prompt_logprobs({"model": "sim-careful", "messages": msgs}) is None
