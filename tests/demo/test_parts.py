"""Demo parts: the simulated model over HTTP, the agent's move runner, the plan, the summary."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest

from budgetproxy.demo.agents import EpisodePlan, EpisodeResult, run_moves
from budgetproxy.demo.frozenlake import MOVE_TOOL, SYSTEM_PROMPT, TASKS, MoveResult, observation
from budgetproxy.demo.model_server import ModelServer
from budgetproxy.demo.run import DemoSettings, plan_episodes
from budgetproxy.demo.summary import what_this_shows


@pytest.fixture(scope="module")
def model() -> Iterator[ModelServer]:
    server = ModelServer(seed=0).start()
    yield server
    server.stop()


def messages() -> list[dict[str, Any]]:
    return [{"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": observation(TASKS[2], (0, 0), [])}]


def test_model_server_answers_with_move_tool_calls(model: ModelServer) -> None:
    with openai.OpenAI(base_url=model.base_url, api_key="x", max_retries=0) as client:
        reply = client.chat.completions.create(
            model="sim-careful", messages=messages(), tools=[MOVE_TOOL], seed=5,  # type: ignore[arg-type,list-item]
        )
        calls = reply.choices[0].message.tool_calls or []
        assert reply.choices[0].finish_reason == "tool_calls"
        assert len(calls) == 2
        assert all(c.function.name == "move" for c in calls)  # type: ignore[union-attr]
        assert reply.usage is not None and reply.usage.total_tokens > 0
        # The same request streamed gives the same calls.
        stream = client.chat.completions.create(
            model="sim-careful", messages=messages(), tools=[MOVE_TOOL], seed=5, stream=True,  # type: ignore[arg-type,list-item]
        )
        streamed = [tc.function.arguments for chunk in stream for c in chunk.choices
                    for tc in c.delta.tool_calls or [] if tc.function is not None]
        assert streamed == [c.function.arguments for c in calls]  # type: ignore[union-attr]
        ids = [m.id for m in client.models.list()]
        assert ids == ["sim-careful", "sim-recovering", "sim-budget-aware"]
        with pytest.raises(openai.NotFoundError):
            client.chat.completions.create(model="gpt-x", messages=messages())  # type: ignore[arg-type]


@dataclass
class _Fn:
    name: str
    arguments: str


@dataclass
class _Call:
    id: str
    function: _Fn


class _SlipperyGame:
    """Slides on the second move; the runner must stop the plan there."""

    done = False

    def __init__(self) -> None:
        self.made = 0

    def move(self, direction: str) -> MoveResult:
        self.made += 1
        return MoveResult(direction, (0, 0), (0, 1), slid=self.made == 2, cell="F")


def test_run_moves_stops_the_plan_after_a_slide() -> None:
    calls = [_Call(f"c{i}", _Fn("move", json.dumps({"direction": d})))
             for i, d in enumerate(["right", "down", "down"])]
    calls.append(_Call("c3", _Fn("move", "{not json")))
    game = _SlipperyGame()
    tool_messages, made = run_moves(game, calls)  # type: ignore[arg-type]
    assert game.made == 2 and len(made) == 2
    assert [m["tool_call_id"] for m in tool_messages] == ["c0", "c1", "c2", "c3"]
    assert "slid" in tool_messages[1]["content"]
    assert tool_messages[2]["content"].startswith("not made: the plan stopped")
    assert tool_messages[3]["content"].startswith("not made")


def test_plan_covers_every_arm_tier_and_budgetmix_group(tmp_path: Path) -> None:
    s = DemoSettings.quick(tmp_path)
    plans = plan_episodes(s)
    tiers = [p for p in plans if p.run == "tiers"]
    assert len(tiers) == len(s.tasks) * 4 * s.k * len(s.arms)
    assert {p.tier for p in tiers} == {25, 50, 75, 100}
    assert {(p.policy, p.disclosure) for p in tiers} == set(s.arms)
    for p in tiers:
        assert p.budget is not None and 1 <= p.budget <= p.task.max_turns
    mix = [p for p in plans if p.run == "budgetmix"]
    assert len(mix) == len(s.tasks) * s.budgetmix_groups * s.k_budgetmix
    assert all(p.budget is None and p.group and p.disclosure == "disclosed" for p in mix)
    # Policies meet the same ice: every arm gets the same (task, tier, seed) slots.
    slots = {arm: sorted((p.task.task_id, p.tier, p.seed) for p in tiers
                         if (p.policy, p.disclosure) == arm) for arm in s.arms}
    assert all(v == slots[s.arms[0]] for v in slots.values())
    assert len(set(slots[s.arms[0]])) == len(s.tasks) * 4 * s.k
    assert plan_episodes(s) == plans


def _row(policy: str, arm: str, tier: str, k: int, value: float | None) -> dict[str, Any]:
    return {"k": k, "tier": tier, "value": value, "by": {"policy": policy, "disclosure": arm}}


def _result(policy: str, arm: str, exhausted: bool) -> EpisodeResult:
    plan = EpisodePlan(TASKS[0], policy, 4, arm, 1)  # type: ignore[arg-type]
    return EpisodeResult(plan, "e", 4, won=not exhausted, turns=4, moves=8, fell=False,
                         exhausted=exhausted)


def test_summary_reads_the_numbers_and_says_when_an_effect_is_missing() -> None:
    rows = [
        _row("careful", "hidden", "25%", 1, 0.6), _row("recovering", "hidden", "25%", 1, 0.2),
        _row("careful", "hidden", "100%", 1, 0.7), _row("recovering", "hidden", "100%", 1, 0.9),
        _row("budget-aware", "hidden", "25%", 1, 0.1),
        _row("budget-aware", "disclosed", "25%", 1, 0.5),
        _row("budget-aware", "hidden", "100%", 1, 0.8),
        _row("budget-aware", "disclosed", "100%", 1, None),
    ]
    results = [_result("careful", "hidden", True), _result("careful", "hidden", False)]
    text = "\n".join(what_this_shows(rows, results))
    assert "at 25%: careful 0.60 > recovering 0.20" in text
    assert "at 100%: recovering 0.90 > careful 0.70" in text
    assert "the order flips" in text
    assert "25%: disclosed 0.50 vs hidden 0.10 (+0.40)" in text
    assert "careful hidden 1/2" in text
    rows[3] = _row("recovering", "hidden", "100%", 1, 0.5)
    assert "no flip in this run" in "\n".join(what_this_shows(rows, results))
    assert "not enough episodes" in "\n".join(what_this_shows(rows[:1], results))
