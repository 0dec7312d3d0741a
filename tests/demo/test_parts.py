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


def _diff(
    field: str, other: str, tier: str, k: int, diff: float | None, low: float, high: float,
    tasks: int = 14, note: str | None = None,
) -> dict[str, Any]:
    a, b = ("careful", "recovering") if field == "policy" else ("disclosed", "hidden")
    excludes = diff is not None and note is None and (low > 0 or high < 0)
    return {"field": field, "a": a, "b": b, "k": k, "tier": tier, "diff": diff, "ci_low": low,
            "ci_high": high, "n_tasks": tasks, "by": {"disclosure" if field == "policy"
                                                      else "policy": other},
            "ci_note": note, "excludes_zero": excludes}  # fmt: skip


def _result(policy: str, arm: str, exhausted: bool) -> EpisodeResult:
    plan = EpisodePlan(TASKS[0], policy, 4, arm, 1)  # type: ignore[arg-type]
    return EpisodeResult(plan, "e", 4, won=not exhausted, turns=4, moves=8, fell=False,
                         exhausted=exhausted)


def test_summary_claims_only_what_the_intervals_support() -> None:
    rows = [
        _diff("policy", "hidden", "25%", 1, 0.18, 0.04, 0.35),
        _diff("policy", "hidden", "100%", 1, -0.14, -0.24, -0.05),
        _diff("policy", "hidden", "25%", 8, 0.05, -0.06, 0.16),
        _diff("policy", "hidden", "100%", 8, 0.0, 0.0, 0.0, note="zero width: no task differs"),
        _diff("disclosure", "budget-aware", "25%", 1, 0.39, 0.23, 0.57),
        _diff("disclosure", "budget-aware", "100%", 1, 0.05, -0.01, 0.13),
    ]
    results = [_result("careful", "hidden", True), _result("careful", "hidden", False)]
    text = "\n".join(what_this_shows(rows, results, ks=(1, 8)))
    assert "careful − recovering (paired over 14 tasks): at 25% +0.18 [+0.04, +0.35], " \
           "at 100% -0.14 [-0.24, -0.05]" in text  # fmt: skip
    assert "The order flips." in text
    assert "K=8: +0.05 [-0.06, +0.16] at 25%, +0.00 (zero width: no task differs) at 100%, " \
           "no supported flip" in text  # fmt: skip
    assert "25%: +0.39 [+0.23, +0.57] *; 100%: +0.05 [-0.01, +0.13]." in text
    assert "excludes 0 at 25%" in text and "at 100% this run cannot tell the arms apart" in text
    assert "careful hidden 1/2" in text
    # An interval that includes 0 is no flip, whatever the point estimates say.
    rows[1] = _diff("policy", "hidden", "100%", 1, -0.09, -0.33, 0.05)
    text = "\n".join(what_this_shows(rows, results))
    assert "The order flips" not in text
    assert "No flip this run can support: at 100% its interval includes 0." in text
    # Nor is one whose interval excludes 0 but that does not hold once adjusted for the
    # comparison's other cells (analyze's Holm): the demo reads many cells.
    rows[1] = dict(_diff("policy", "hidden", "100%", 1, -0.14, -0.24, -0.05),
                   p_adjusted=0.09, significant=False)
    text = "\n".join(what_this_shows(rows, results))
    assert "The order flips" not in text
    assert ("at 100% its interval excludes 0 but its p-value adjusted over the comparison's "
            "cells (0.09) is not below 0.05.") in text
    adjusted = [dict(r, significant=False, p_adjusted=0.2) if r["field"] == "disclosure" else r
                for r in rows]
    text = "\n".join(what_this_shows(adjusted, results))
    assert "25%: +0.39 [+0.23, +0.57]; 100%" in text  # no star
    assert ("This run does not show an effect of disclosure: at 25% its interval excludes 0 "
            "but its p-value adjusted over the comparison's cells (0.20) is not below 0.05; at "
            "100% its interval includes 0.") in text
    # One tier rejected by the adjustment, another on too few tasks: each said as it is.
    mixed = [*adjusted[:5], dict(adjusted[5], n_tasks=3)]
    text = "\n".join(what_this_shows(mixed, results))
    assert ("at 25% its interval excludes 0 but its p-value adjusted over the comparison's "
            "cells (0.20) is not below 0.05; at 100% fewer than 10 tasks.") in text
    # A zero-width interval away from 0 is no interval holding 0.
    rows[1] = _diff("policy", "hidden", "100%", 1, -0.5, -0.5, -0.5, note="zero width")
    text = "\n".join(what_this_shows(rows, results))
    assert "at 100% its interval has no spread to read (zero width)." in text
    # Intervals over a handful of tasks exclude 0 too easily: no effect is named on them.
    few = [dict(r, n_tasks=2) for r in rows]
    text = "\n".join(what_this_shows(few, results))
    assert "fewer than 10, so the intervals rest on few draws" in text
    assert "No flip this run can support: fewer than 10 tasks." in text
    assert "+0.39 [+0.23, +0.57];" in text and "Fewer than 10 tasks: too few to name" in text
    rows[4] = _diff("disclosure", "budget-aware", "25%", 1, 0.1, -0.1, 0.3)
    assert "this run does not show an effect of disclosure" in "\n".join(
        what_this_shows(rows, results))  # fmt: skip
    assert "not enough episodes" in "\n".join(what_this_shows(rows[4:5], results))
