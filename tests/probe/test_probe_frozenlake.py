"""The FrozenLake scorer: Q* against an independent value iteration over gymnasium's own
transition table, on every shipped map; plan values and the injected error."""

from __future__ import annotations

import random

import gymnasium as gym
import pytest

from budgetproxy.demo.frozenlake import DIRECTIONS, TASKS, Task, observation
from budgetproxy.demo.policies import parse_observation
from budgetproxy.probe.scorers import frozenlake as fl
from budgetproxy.probe.scorers import load_scorer
from budgetproxy.probe.states import State


def gym_q(task: Task, horizon: int, discount: float) -> list[list[float]]:
    """Finite-horizon value iteration on gymnasium's FrozenLake-v1 P table: Q_H[s][a]."""
    env = gym.make("FrozenLake-v1", desc=list(task.rows), is_slippery=task.slippery,
                   success_rate=task.success_rate)
    table = env.unwrapped.P
    n = len(table)
    v = [0.0] * n
    q = [[0.0] * 4 for _ in range(n)]
    for _ in range(horizon):
        q = [[sum(p * (r + (0.0 if done else discount * v[s2])) for p, s2, r, done in table[s][a])
              for a in range(4)] for s in range(n)]
        v = [max(row) for row in q]
    env.close()
    return q


@pytest.mark.parametrize("task", TASKS, ids=[t.task_id for t in TASKS])
def test_q_star_matches_value_iteration_on_gymnasium_transitions(task: Task) -> None:
    obs = parse_observation(observation(task, task.start, []))
    assert obs is not None
    slide = obs.slide  # what the prompt states, which the scorer reads
    horizon = fl.horizon_for(task.rows)
    assert horizon == (100 if task.task_id.startswith("4x4") else 200)
    expected = gym_q(task, horizon, fl.DISCOUNT)
    ncol = len(task.rows[0])
    checked = 0
    for s, row in enumerate(expected):
        cell = divmod(s, ncol)
        if task.rows[cell[0]][cell[1]] in "HG":
            continue
        for a, want in enumerate(row):
            got = fl.q_star(task.rows, slide, cell, DIRECTIONS[a])
            assert got == pytest.approx(want, abs=1e-12), (task.task_id, cell, DIRECTIONS[a])
            checked += 1
    assert checked == 4 * sum(ch in "SF" for r in task.rows for ch in r)
    # the start is worth something and a best move beats the worst one
    start = [fl.q_star(task.rows, slide, task.start, d) for d in DIRECTIONS]
    assert max(start) > min(start) and max(start) > 0


def _state(task: Task, text: str, conversation: list[dict] | None = None) -> State:
    conv = conversation or [{"role": "system", "content": "play"},
                            {"role": "user", "content": text}]
    return State(task_id=task.task_id, source="a", episode_id="e", turn=2, fraction=0.5,
                 conversation=tuple(conv), messages=tuple(conv), disclosure="hidden",
                 budget=10, max_turns=16, remaining=9)


def _move(direction: str) -> dict:
    return {"id": "c", "type": "function",
            "function": {"name": "move", "arguments": f'{{"direction": "{direction}"}}'}}


def test_score_is_q_star_for_one_move_and_a_plan_value_for_several() -> None:
    task = TASKS[1]  # 4x4 slippery
    state = _state(task, observation(task, (0, 0), []))
    one = fl.score(state, {"content": None, "tool_calls": [_move("down")]})
    assert one == pytest.approx(fl.q_star(task.rows, 0.25, (0, 0), "down"))
    # Two moves on plain ice: exactly the second move's Q* one step later, discounted.
    plain = TASKS[0]
    s2 = _state(plain, observation(plain, (0, 0), []))
    two = fl.score(s2, {"content": None, "tool_calls": [_move("down"), _move("down")]})
    h = fl.horizon_for(plain.rows)
    assert two == pytest.approx(fl.DISCOUNT * fl.q_star(plain.rows, 0.0, (1, 0), "down", h - 1))
    # Invalid calls are skipped; a reply with no valid move is a wasted move.
    none = fl.score(s2, {"content": "hmm", "tool_calls": [
        {"id": "x", "type": "function", "function": {"name": "move", "arguments": "{bad"}}]})
    assert none == pytest.approx(fl.DISCOUNT * fl.values(plain.rows, 0.0, h)[h - 1][(0, 0)])
    # Into a hole is worth nothing.
    hole = _state(plain, observation(plain, (0, 1), []))
    assert fl.score(hole, {"tool_calls": [_move("down")]}) == 0.0


def test_injected_action_error_is_a_slide_to_a_worse_cell() -> None:
    task = TASKS[0]
    game_text = observation(task, (0, 1), [])
    first = {"role": "user", "content": game_text}
    from budgetproxy.demo.frozenlake import MoveResult

    moved = MoveResult("right", (0, 1), (0, 2), slid=False, cell="F")
    conv = [{"role": "system", "content": "play"}, first,
            {"role": "assistant", "content": None, "tool_calls": [_move("right")]},
            {"role": "tool", "tool_call_id": "c", "content": moved.text()},
            {"role": "user", "content": observation(task, (0, 2), [moved])}]
    state = _state(task, "", conv)
    hurt = fl.inject_action(state, random.Random(0))
    assert hurt is not None and hurt.injected == "action"
    obs = parse_observation(hurt.conversation[-1]["content"])
    assert obs is not None and obs.slid and obs.planned == (0, 2)
    assert obs.position != (0, 2) and task.rows[obs.position[0]][obs.position[1]] not in "HG"
    assert "slid on the ice" in hurt.conversation[3]["content"]
    table = fl.values(task.rows, 0.0, fl.horizon_for(task.rows))[-1]
    assert table[obs.position] < table[(0, 2)]
    # a first turn has no last move to make wrong
    assert fl.inject_action(_state(task, game_text), random.Random(0)) is None


def test_the_built_in_scorer_loads_with_its_hooks() -> None:
    s = load_scorer("frozenlake")
    assert s.score is fl.score and s.inject_action is fl.inject_action
    assert s.continue_episode is not None and s.error_pattern == "slid on the ice"
