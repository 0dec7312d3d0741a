"""Simulated policies: deterministic per seed, deciding from the prompt text alone."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import pytest

from budgetproxy.config import DisclosureConfig
from budgetproxy.core import disclosure
from budgetproxy.demo import policies as po
from budgetproxy.demo import tokens
from budgetproxy.demo.frozenlake import (
    SYSTEM_PROMPT,
    TASKS,
    Game,
    MoveResult,
    observation,
    step_target,
)
from budgetproxy.demo.model_server import completion

PLAIN_4, SLIPPERY_4, PLAIN_8, SLIPPERY_8 = TASKS


def prompt(text: str, budget_line: str | None = None) -> list[dict[str, Any]]:
    if budget_line is not None:
        text += "\n\n" + budget_line
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": text}]


def budget_line(turn: int, total: int) -> str:
    """The line the proxy appends in the disclosed arm, from its default template."""
    return disclosure.render(DisclosureConfig().template, turn, total, None)


def body(model: str, messages: list[dict[str, Any]], seed: int = 1) -> dict[str, Any]:
    return {"model": model, "messages": messages, "seed": seed}


def moves_of(reply: dict[str, Any] | None) -> list[str]:
    assert reply is not None
    calls = reply["choices"][0]["message"].get("tool_calls") or []
    return [c["function"]["arguments"].split('"')[3] for c in calls]


SLID = MoveResult("right", (0, 0), (1, 0), slid=True, cell="F")


def test_parse_observation_reads_what_the_agent_wrote() -> None:
    obs = po.parse_observation(observation(SLIPPERY_4, (1, 0), [SLID]))
    assert obs is not None
    assert obs.rows == SLIPPERY_4.rows
    assert (obs.position, obs.goal) == ((1, 0), (3, 3))
    assert obs.slide == pytest.approx(1 - SLIPPERY_4.success_rate)
    assert obs.slid and obs.planned == (0, 1)
    plain = po.parse_observation(observation(PLAIN_4, (0, 0), []))
    assert plain is not None and plain.slide == 0 and not plain.slid and plain.planned is None
    assert po.parse_observation("hello, no map here") is None


def test_parse_budget_reads_the_proxys_default_template() -> None:
    assert po.parse_budget(budget_line(3, 8)) == po.BudgetLine(turn=3, total=8, remaining=5)
    assert po.parse_budget(budget_line(1, 2) + "\n" + budget_line(2, 2)) == po.BudgetLine(2, 2, 0)
    assert po.parse_budget(budget_line(4, 5)) == po.BudgetLine(4, 5, 1)  # "1 turn remains"
    assert po.parse_budget("no budget here") is None


def test_same_request_same_reply_and_seeds_sample() -> None:
    messages = prompt(observation(PLAIN_8, (0, 0), []))
    for name in po.POLICIES:
        first = completion(7, body(f"sim-{name}", messages, seed=3))
        assert first is not None
        assert completion(7, body(f"sim-{name}", messages, seed=3)) == first
    model = "sim-recovering"
    plans = {tuple(moves_of(completion(0, body(model, messages, s)))) for s in range(40)}
    assert len(plans) > 1  # request seeds sample like a temperature would
    served = {tuple(moves_of(completion(s, body(model, messages, 1)))) for s in range(40)}
    assert len(served) > 1  # and so does the server's seed


def test_reply_depends_on_the_prompt_only() -> None:
    # Two games with different hidden random states that show the same position give the
    # same prompt, hence the same reply; the environment is never consulted.
    a, b = Game(SLIPPERY_8, seed=1), Game(SLIPPERY_8, seed=999)
    try:
        texts = [observation(SLIPPERY_8, g.pos, []) for g in (a, b)]
    finally:
        a.close()
        b.close()
    assert texts[0] == texts[1]
    replies = [completion(0, body("sim-careful", prompt(t))) for t in texts]
    assert replies[0] == replies[1]
    # A hand-written prompt in the same words works just as well: text is all it reads.
    hand = "\n".join(["FrozenLake map tiny (not slippery).", "SF", "FG",
                      "You are at (0,1). The goal is at (1,1).", "Which way next?"])
    assert moves_of(completion(0, body("sim-careful", prompt(hand)))) in (["down"], ["down"] * 2)
    # Unknown models are not answered by the simulation.
    assert completion(0, body("gpt-x", prompt(hand))) is None


def test_careful_takes_better_single_steps_than_recovering() -> None:
    obs_text = observation(PLAIN_8, (0, 0), [])
    obs = po.parse_observation(obs_text)
    assert obs is not None
    values = po.move_values(obs.rows, obs.slide)

    def best_share(name: str) -> float:
        params = po.POLICIES[name]
        hits = 0
        for seed in range(400):
            first = po.decide(params, prompt(obs_text), random.Random(seed))[0]
            hits += values[(0, 0)][first] >= max(values[(0, 0)].values()) - 1e-9
        return hits / 400

    careful, recovering = best_share("careful"), best_share("recovering")
    assert careful > recovering + 0.15
    assert careful == pytest.approx(po.POLICIES["careful"].step_accuracy, abs=0.06)


def test_recovery_decides_where_the_policy_plans_from_after_a_slide() -> None:
    # After sliding down to (1,0) instead of right to (0,1): a recovering step plans from
    # (1,0), a stale one from (0,1). With perfect steps the two give different first moves.
    text = observation(SLIPPERY_8, (1, 0), [SLID])
    perfect = po.PolicyParams("perfect", step_accuracy=1.0, recovery=1.0, pace=1)
    stale = dataclasses.replace(perfect, recovery=0.0)
    obs = po.parse_observation(text)
    assert obs is not None
    values = po.move_values(obs.rows, obs.slide)
    best_from = {
        cell: {d for d, v in values[cell].items() if v >= max(values[cell].values()) - 1e-9}
        for cell in ((1, 0), (0, 1))
    }
    for seed in range(20):
        assert po.decide(perfect, prompt(text), random.Random(seed))[0] in best_from[(1, 0)]
        assert po.decide(stale, prompt(text), random.Random(seed))[0] in best_from[(0, 1)]
    careful, recovering = po.POLICIES["careful"], po.POLICIES["recovering"]
    assert careful.recovery < 0.5 < recovering.recovery
    assert careful.step_accuracy > recovering.step_accuracy


def test_budget_aware_paces_itself_by_the_disclosed_budget_only() -> None:
    text = observation(PLAIN_8, (0, 0), [])
    aware, careful = po.POLICIES["budget-aware"], po.POLICIES["careful"]
    rng = random.Random
    assert len(po.decide(aware, prompt(text), rng(1))) == aware.pace == 1
    assert len(po.decide(aware, prompt(text, budget_line(1, 4)), rng(1))) == aware.max_pace
    assert len(po.decide(aware, prompt(text, budget_line(1, 64)), rng(1))) == 1
    # 14 cells away: 8 turns left → ceil(2.0 × 14 / 8) = 4 moves; 12 turns left → 3.
    assert len(po.decide(aware, prompt(text, budget_line(3, 10)), rng(1))) == 4
    assert len(po.decide(aware, prompt(text, budget_line(1, 12)), rng(1))) == 3
    for line in (None, budget_line(1, 4), budget_line(1, 64)):
        assert len(po.decide(careful, prompt(text, line), rng(1))) == careful.pace


def test_sloppy_moves_never_walk_into_a_visible_hole() -> None:
    sloppy = po.PolicyParams("sloppy", step_accuracy=0.0, recovery=1.0, pace=1)
    for task in (PLAIN_4, PLAIN_8):
        for r, row in enumerate(task.rows):
            for c, letter in enumerate(row):
                if letter in "HG":
                    continue
                text = observation(task, (r, c), [])
                for seed in range(5):
                    (move,) = po.decide(sloppy, prompt(text), random.Random(seed))
                    target = step_target(task.rows, (r, c), move)
                    assert task.rows[target[0]][target[1]] != "H", (task.task_id, (r, c), move)


def test_policy_for_model() -> None:
    assert po.policy_for_model("sim-careful") is po.POLICIES["careful"]
    assert po.policy_for_model("sim-nope") is None
    assert po.policy_for_model("careful") is None


def token_line(remaining: int, total: int) -> str:
    """The token arm's line, rendered by the proxy's disclosure code from its template."""
    from budgetproxy.demo.token_arm import TEMPLATE

    fields = dict.fromkeys(disclosure.AXIS_FIELDS, "n/a") | {
        "tokens_remaining": remaining, "tokens_total": total, "tokens_used": total - remaining}
    return disclosure.render(TEMPLATE, 1, 64, None, fields)


def test_budget_aware_paces_itself_by_the_disclosed_token_line() -> None:
    text = observation(PLAIN_8, (0, 0), [])
    aware, careful = po.POLICIES["budget-aware"], po.POLICIES["careful"]
    one_call = tokens.prompt_tokens(prompt(text), None) + tokens.reply_tokens(1)
    assert po.parse_tokens(token_line(1234, 5000)) == 1234
    assert po.parse_budget(token_line(1234, 5000)) is None  # not a turn line
    # Tokens for 3 more calls: 14 cells away → ceil(2.0 × 14 / 3) = 10, capped at 4 moves.
    assert len(po.decide(aware, prompt(text, token_line(3 * one_call + 50, 10**5)),
                         random.Random(1))) == aware.max_pace
    assert len(po.decide(aware, prompt(text, token_line(10**6, 10**6)), random.Random(1))) == 1
    for remaining in (one_call, 10**6):
        assert len(po.decide(careful, prompt(text, token_line(remaining, 10**6)),
                             random.Random(1))) == careful.pace


def test_turns_paid_counts_calls_of_a_growing_prompt() -> None:
    reply = tokens.reply_tokens(1)
    assert tokens.turns_paid(0, 100, 10) == 0
    assert tokens.turns_paid(100 + reply, 100, 10) == 1
    assert tokens.turns_paid(2 * (100 + reply) + 10, 100, 10) == 2
    assert tokens.turns_paid(2 * (100 + reply) + 9, 100, 10) == 1


def test_usage_is_the_whole_prompt_and_each_call() -> None:
    from budgetproxy.demo.frozenlake import MOVE_TOOL

    messages = prompt(observation(PLAIN_8, (0, 0), []))
    reply = completion(0, body("sim-careful", messages) | {"tools": [MOVE_TOOL]})
    assert reply is not None
    usage, calls = reply["usage"], reply["choices"][0]["message"]["tool_calls"]
    assert usage["prompt_tokens"] == tokens.prompt_tokens(messages, [MOVE_TOOL])
    # about four characters a token over what was sent: texts, and the tool schema
    sent = len(SYSTEM_PROMPT) + len(messages[1]["content"]) + len(str(MOVE_TOOL))
    assert sent / 5 < usage["prompt_tokens"] < sent / 3
    assert usage["completion_tokens"] == tokens.REPLY_TOKENS + tokens.CALL_TOKENS * len(calls)
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    # the next call re-reads the whole conversation, its own calls included
    longer = [*messages, reply["choices"][0]["message"],
              {"role": "tool", "tool_call_id": calls[0]["id"], "content": "moved"}]
    again = completion(0, body("sim-careful", longer) | {"tools": [MOVE_TOOL]})
    assert again is not None and again["usage"]["prompt_tokens"] > usage["prompt_tokens"] + 20


def test_an_output_cap_ends_the_reply_early() -> None:
    messages = prompt(observation(PLAIN_8, (0, 0), []))
    full = completion(0, body("sim-careful", messages))
    assert full is not None and len(full["choices"][0]["message"]["tool_calls"]) == 2
    cut = completion(0, body("sim-careful", messages) | {"max_completion_tokens": 20})
    assert cut is not None
    assert cut["choices"][0]["finish_reason"] == "length"
    assert len(cut["choices"][0]["message"]["tool_calls"]) == 1
    assert cut["usage"]["completion_tokens"] == 20
    none = completion(0, body("sim-careful", messages) | {"max_tokens": 3})
    assert none is not None and none["choices"][0]["finish_reason"] == "length"
    assert none["choices"][0]["message"]["content"] == "" and "tool_calls" not in (
        none["choices"][0]["message"])
    assert none["usage"]["completion_tokens"] == 3
    roomy = completion(0, body("sim-careful", messages) | {"max_completion_tokens": 1000})
    assert roomy is not None and roomy["choices"] == full["choices"]
