"""The FrozenLake scorer: an action's exact value Q* by finite-horizon dynamic programming.

A state is the demo's FrozenLake conversation: its last observation gives the map, the position
and the slide chance. An action is the model's reply; its ``move`` calls run in order as the
demo's agent runs them (an invalid call is skipped, at most four moves are made, a slide ends
the plan, a hole or the goal ends the game), and then the agent is taken to act optimally. The
score is the discounted chance of reaching the goal: reward 1 on entering G, discount 0.95 per
move, horizon gymnasium's episode limit for the map (100 moves on 4x4 and smaller, 200 on
larger maps). For
a single move it is exactly Q*(s, a). A reply without a valid move scores as a wasted move.

``inject_action`` is the error ``--inject action`` puts in: the state's last move is rewritten
to have gone wrong, ending on the worst neighbouring cell by V* that is neither a hole nor the
goal (a slide, as the ice does; on plain ice it stands for a move that went astray), with the
tool result and the observation saying so.
"""

from __future__ import annotations

import functools
import json
import random
import re
from collections.abc import Sequence
from typing import Any

from budgetproxy.demo.frozenlake import (
    DIRECTIONS,
    MOVES_PER_TURN,
    MoveResult,
    Pos,
    step_target,
)
from budgetproxy.demo.policies import Observation, parse_observation
from budgetproxy.probe.scorers.frozenlake_play import continue_episode
from budgetproxy.probe.states import State, message_text, with_messages

__all__ = ["DISCOUNT", "ERROR_PATTERN", "continue_episode", "inject_action", "q_star", "score",
           "values"]

DISCOUNT = 0.95
ERROR_PATTERN = r"slid on the ice"  # the demo's states that already hold an error


def horizon_for(rows: Sequence[str]) -> int:
    """gymnasium's episode limit: 100 steps for FrozenLake-v1 (4x4), 200 for FrozenLake8x8."""
    return 100 if len(rows) * len(rows[0]) <= 16 else 200


def outcomes(rows: Sequence[str], cell: Pos, direction: str, slide: float
             ) -> list[tuple[float, Pos]]:
    """Where one move can end, with chances: as meant, or sideways (half each side)."""
    if slide <= 0:
        return [(1.0, step_target(rows, cell, direction))]
    i = DIRECTIONS.index(direction)
    return [(1 - slide, step_target(rows, cell, direction)),
            (slide / 2, step_target(rows, cell, DIRECTIONS[(i - 1) % 4])),
            (slide / 2, step_target(rows, cell, DIRECTIONS[(i + 1) % 4]))]


def _terminal(rows: Sequence[str], cell: Pos) -> bool:
    return rows[cell[0]][cell[1]] in "HG"


@functools.lru_cache(maxsize=32)
def values(rows: tuple[str, ...], slide: float, horizon: int,
           discount: float = DISCOUNT) -> tuple[dict[Pos, float], ...]:
    """V*_h for h = 0..horizon: the best discounted chance of reaching G within h moves."""
    cells = [(r, c) for r in range(len(rows)) for c in range(len(rows[0]))]
    table: list[dict[Pos, float]] = [dict.fromkeys(cells, 0.0)]
    for _ in range(horizon):
        prev = table[-1]
        table.append({cell: 0.0 if _terminal(rows, cell) else max(
            _q(rows, slide, discount, prev, cell, d) for d in DIRECTIONS) for cell in cells})
    return tuple(table)


def _q(rows: Sequence[str], slide: float, discount: float, prev: dict[Pos, float], cell: Pos,
       direction: str) -> float:
    total = 0.0
    for p, to in outcomes(rows, cell, direction, slide):
        letter = rows[to[0]][to[1]]
        total += p * (1.0 if letter == "G" else 0.0 if letter == "H" else discount * prev[to])
    return total


def q_star(rows: tuple[str, ...], slide: float, cell: Pos, direction: str,
           horizon: int | None = None, discount: float = DISCOUNT) -> float:
    """Q*_H(cell, direction) with H moves left (the map's horizon by default)."""
    h = horizon_for(rows) if horizon is None else horizon
    if h <= 0:
        return 0.0
    table = values(rows, slide, h, discount)
    return _q(rows, slide, discount, table[h - 1], cell, direction)


def plan_value(rows: tuple[str, ...], slide: float, cell: Pos, moves: Sequence[str],
               horizon: int, discount: float = DISCOUNT) -> float:
    """The value of running `moves` from `cell` (a slide ends the plan), then acting optimally."""
    table = values(rows, slide, horizon, discount)
    if horizon <= 0:
        return 0.0
    if not moves:
        return discount * table[horizon - 1][cell]
    total = 0.0
    for p, to in outcomes(rows, cell, moves[0], slide):
        letter = rows[to[0]][to[1]]
        if letter in "HG":
            total += p * (1.0 if letter == "G" else 0.0)
            continue
        slid = to != step_target(rows, cell, moves[0])
        rest = table[horizon - 1][to] if slid or len(moves) == 1 else plan_value(
            rows, slide, to, moves[1:], horizon - 1, discount)
        total += p * discount * rest
    return total


def moves_of(action: Any) -> list[str]:
    """The valid move directions of a reply, in order, as many as the agent runs."""
    out = []
    for call in (action or {}).get("tool_calls") or []:
        fn = call.get("function") or {} if isinstance(call, dict) else {}
        if fn.get("name") != "move":
            continue
        try:
            direction = json.loads(fn.get("arguments") or "").get("direction")
        except (ValueError, AttributeError):
            continue
        if direction in DIRECTIONS:
            out.append(direction)
    return out[:MOVES_PER_TURN]


def last_observation(state: State) -> tuple[int, Observation]:
    """The index and reading of the state's last FrozenLake observation."""
    for i in range(len(state.conversation) - 1, -1, -1):
        m = state.conversation[i]
        if m.get("role") in ("user", "tool"):
            obs = parse_observation(message_text(m))
            if obs is not None:
                return i, obs
    raise ValueError("no FrozenLake observation in this state")


def score(state: State, action: dict[str, Any]) -> float:
    """The scorer: the reply's exact value from the state's real position."""
    _, obs = last_observation(state)
    return plan_value(obs.rows, obs.slide, obs.position, moves_of(action), horizon_for(obs.rows))


_LAST = re.compile(r"^- move (left|down|right|up) from \((\d+),(\d+)\): .*$", re.M)
_AT = re.compile(r"You are at \(\d+,\d+\)")


def inject_action(state: State, rng: random.Random) -> State | None:
    """The state with its last move gone wrong (see the module text); None without one.
    The worst wrong cell is chosen, not drawn: `rng` is unused."""
    idx, obs = last_observation(state)
    text = message_text(state.conversation[idx])
    lines = list(_LAST.finditer(text))
    if not lines:
        return None
    last = lines[-1]
    direction, frm = last.group(1), (int(last.group(2)), int(last.group(3)))
    meant = step_target(obs.rows, frm, direction)
    i = DIRECTIONS.index(direction)
    table = values(obs.rows, obs.slide, horizon_for(obs.rows))[-1]
    wrong = sorted(
        {step_target(obs.rows, frm, DIRECTIONS[(i + k) % 4]) for k in (-1, 1)} - {meant},
        key=lambda c: (table[c], c))
    wrong = [c for c in wrong if not _terminal(obs.rows, c)]
    if not wrong:
        return None
    to = wrong[0]
    line = "- " + MoveResult(direction, frm, to, slid=True, cell=obs.rows[to[0]][to[1]]).text()
    new_text = text[: last.start()] + line + text[last.end():]
    new_text = _AT.sub(f"You are at ({to[0]},{to[1]})", new_text, count=1)
    conv = [dict(m) for m in state.conversation]
    conv[idx]["content"] = new_text
    # The tool result of that move says the same.
    for j in range(idx - 1, -1, -1):
        m = conv[j]
        if m.get("role") == "assistant":
            break
        if m.get("role") == "tool" and message_text(m) == last.group(0)[2:]:
            conv[j]["content"] = line[2:]
    return with_messages(state, conv, "action")
