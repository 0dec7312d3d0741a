"""Simulated FrozenLake policies: prompt text in, ``move`` tool calls out, deterministic per seed.

A policy sees only the chat messages of the request: the map, the position and the last
moves as the agent wrote them (``frozenlake.observation``), plus the budget line the proxy
appended when the episode's arm is disclosed. It keeps no state between calls and never looks
at the environment. Its randomness comes from the ``random.Random`` it is handed, which the
model server seeds from (demo seed, request seed, message content).

Each turn a policy plans ``pace`` moves from where it believes it is. It values moves by
solving the map it was shown (value iteration, with the slide chance the prompt states). A
planned move is a best move with probability ``step_accuracy``, otherwise another move that
cannot end in a hole (a detour or a bump into the edge: it costs moves, not the game). The
agent runs the moves in order and stops the plan when the ice makes a move slide. After a
slide the policy re-plans from where it really is with probability ``recovery``; otherwise it
carries on as if the slide had not happened, planning from the cell it meant to reach, which
is how games end in holes.

==============  =============  ========  =====  ===========================================
policy          step_accuracy  recovery  pace   in short
==============  =============  ========  =====  ===========================================
careful         0.95           0.10      2      precise, but lost after a slide
recovering      0.65           0.95      2      sloppy, but finds its way back
budget-aware    0.85           0.85      1-4    paces itself by the disclosed budget
==============  =============  ========  =====  ===========================================

``budget-aware`` plans one move a turn unless the prompt carries a budget line (the proxy's
"Turn t of T. N turns remain ..."); then it plans ceil(margin × distance / turns left) moves,
``margin`` = 2.0, between 1 and 4. It has no other way to know its budget. A token line
("N tokens remain ...") is read the same way: the turns left are the calls those tokens pay
for, each call costing this prompt's tokens (``prompt_tokens``, the count the simulated model
reports) plus the growth of one more turn per call already made.

These numbers were set so that the study's effects can show on real runs: better single steps
win under a tight budget, recovery wins under a loose one, and a policy that reads the budget
uses it. The demo measures whether they do; if an effect stops showing, change these
documented parameters, never the results.
"""

from __future__ import annotations

import functools
import math
import random
import re
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from budgetproxy.demo.frozenlake import DIRECTIONS, Pos, step_target
from budgetproxy.demo.tokens import message_text, prompt_tokens, turns_paid


@dataclass(frozen=True)
class PolicyParams:
    """The documented knobs of one simulated policy."""

    name: str
    step_accuracy: float  # P(a planned move is a shortest-path move)
    recovery: float  # P(re-planning from the real position after a slide)
    pace: int  # moves planned per turn when no budget is disclosed
    budget_aware: bool = False
    max_pace: int = 4  # budget-aware: the fastest pace it will go
    # budget-aware: moves it expects to need per cell of distance (slides and detours).
    margin: float = 1.6


POLICIES: dict[str, PolicyParams] = {
    p.name: p
    for p in (
        PolicyParams("careful", step_accuracy=0.95, recovery=0.1, pace=2),
        PolicyParams("recovering", step_accuracy=0.65, recovery=0.95, pace=2),
        PolicyParams(
            "budget-aware", step_accuracy=0.85, recovery=0.85, pace=1, budget_aware=True,
            max_pace=4, margin=2.0,
        ),
    )
}

MODEL_PREFIX = "sim-"
# Discount per move in the policies' move values: a sooner goal is worth more.
DISCOUNT = 0.99


# Simulated training checkpoints (the demo's dynamics run): step 0 is careful, the last step
# recovering, and the steps between interpolate both knobs linearly, as RL that trades
# single-step precision for recovery would (the study: trajectory reward up, single-step
# reward down over training).
CHECKPOINT_STEPS = (0, 100, 200, 300)
_STEP = re.compile(r"step-(\d{1,9})")


def checkpoint_policy(step: int, last: int = CHECKPOINT_STEPS[-1]) -> PolicyParams:
    """The policy at training `step` of `last`: careful's knobs moved towards recovering's."""
    f = min(1.0, step / last)
    a, b = POLICIES["careful"], POLICIES["recovering"]
    return PolicyParams(
        f"step-{step}", step_accuracy=a.step_accuracy + f * (b.step_accuracy - a.step_accuracy),
        recovery=a.recovery + f * (b.recovery - a.recovery), pace=a.pace,
    )


def policy_for_model(model: str) -> PolicyParams | None:
    """``sim-careful`` → the careful policy, ``sim-step-100`` → that checkpoint; None for a name
    that is not a simulated policy."""
    if not model.startswith(MODEL_PREFIX):
        return None
    name = model[len(MODEL_PREFIX) :]
    step = _STEP.fullmatch(name)
    return checkpoint_policy(int(step.group(1))) if step else POLICIES.get(name)


@dataclass(frozen=True)
class Observation:
    """What the agent's last message says about the game."""

    rows: tuple[str, ...]
    position: Pos
    goal: Pos
    slide: float  # chance a move slides sideways, as the text states (0 on plain ice)
    slid: bool  # a move of the last turn slid
    planned: Pos | None  # where the last turn's moves would have led without slides


@dataclass(frozen=True)
class BudgetLine:
    """The disclosed budget: this turn's number, the total and the turns left after this one."""

    turn: int | None
    total: int | None
    remaining: int


_ROW = re.compile(r"^[SFHG]+$")
_AT = re.compile(r"You are at \((\d+),(\d+)\)")
_GOAL = re.compile(r"goal is at \((\d+),(\d+)\)")
_MOVE = re.compile(r"^- move (left|down|right|up) from \((\d+),(\d+)\): (moved|slid)", re.M)
_SLIDE = re.compile(r"(\d+)% of moves slide")
_OVER = re.compile(r"reached the goal|fell into a hole|the game is over")
_TURN_OF = re.compile(r"Turn (\d+) of (\d+)")
_REMAIN = re.compile(r"(\d+) turns? remain")
_TOKENS = re.compile(r"(\d+) tokens? remain")


def parse_tokens(text: str) -> int | None:
    """The tokens left in the last token line of the text ("N tokens remain ..."), if any."""
    found = list(_TOKENS.finditer(text))
    return int(found[-1].group(1)) if found else None


def parse_observation(text: str) -> Observation | None:
    """Read the map, position and last moves; None when the text is not a FrozenLake turn."""
    rows = tuple(line.strip() for line in text.splitlines() if _ROW.match(line.strip()))
    at, goal = _AT.search(text), _GOAL.search(text)
    if not rows or at is None or goal is None or len({len(r) for r in rows}) != 1:
        return None
    moves = _MOVE.findall(text)
    slide = _SLIDE.search(text)
    planned: Pos | None = None
    if moves:
        planned = (int(moves[0][1]), int(moves[0][2]))
        for direction, *_ in moves:
            planned = step_target(rows, planned, direction)
    return Observation(
        rows=rows,
        position=(int(at.group(1)), int(at.group(2))),
        goal=(int(goal.group(1)), int(goal.group(2))),
        slide=int(slide.group(1)) / 100 if slide else 0.0,
        slid=any(m[3] == "slid" for m in moves),
        planned=planned,
    )


def parse_budget(text: str) -> BudgetLine | None:
    """The last budget line in the text (the proxy's default template or one like it)."""
    remain = list(_REMAIN.finditer(text))
    if not remain:
        return None
    last = remain[-1]
    turn_of = [m for m in _TURN_OF.finditer(text) if m.start() <= last.start()]
    turn = total = None
    if turn_of:
        turn, total = int(turn_of[-1].group(1)), int(turn_of[-1].group(2))
    return BudgetLine(turn=turn, total=total, remaining=int(last.group(1)))


def distances(rows: Sequence[str], goal: Pos) -> dict[Pos, int]:
    """Moves to the goal from every cell that can reach it without crossing a hole."""
    dist = {goal: 0}
    queue = deque([goal])
    while queue:
        cell = queue.popleft()
        for direction in DIRECTIONS:
            # Moves are symmetric on a grid, so walking out from the goal finds predecessors.
            prev = step_target(rows, cell, direction)
            if prev not in dist and rows[prev[0]][prev[1]] != "H":
                dist[prev] = dist[cell] + 1
                queue.append(prev)
    return dist


@functools.lru_cache(maxsize=64)
def move_values(rows: tuple[str, ...], slide: float) -> dict[Pos, dict[str, float]]:
    """Value of each move from each cell: the discounted chance of reaching the goal.

    Value iteration over the map as written in the prompt, with the slide chance the prompt
    states (``slide`` = chance a move goes sideways, split evenly between the two sides). A pure
    function of prompt text, cached so that each map is solved once.
    """
    cells = [(r, c) for r in range(len(rows)) for c in range(len(rows[0]))]
    value = dict.fromkeys(cells, 0.0)
    q: dict[Pos, dict[str, float]] = {}

    def outcomes(cell: Pos, d: str) -> list[tuple[float, Pos]]:
        if slide <= 0:
            return [(1.0, step_target(rows, cell, d))]
        i = DIRECTIONS.index(d)
        return [
            (1 - slide, step_target(rows, cell, d)),
            (slide / 2, step_target(rows, cell, DIRECTIONS[(i - 1) % 4])),
            (slide / 2, step_target(rows, cell, DIRECTIONS[(i + 1) % 4])),
        ]

    def worth(cell: Pos) -> float:
        letter = rows[cell[0]][cell[1]]
        return 1.0 if letter == "G" else 0.0 if letter == "H" else DISCOUNT * value[cell]

    for _ in range(4 * len(cells)):
        delta = 0.0
        for cell in cells:
            if rows[cell[0]][cell[1]] in "HG":
                continue
            q[cell] = {d: sum(p * worth(t) for p, t in outcomes(cell, d)) for d in DIRECTIONS}
            best = max(q[cell].values())
            delta = max(delta, abs(best - value[cell]))
            value[cell] = best
        if delta < 1e-9:
            break
    return q


def hole_chance(rows: Sequence[str], at: Pos, d: str, slide: float) -> float:
    """Chance that one move ends in a hole."""
    i = DIRECTIONS.index(d)
    sides = (DIRECTIONS[(i - 1) % 4], DIRECTIONS[(i + 1) % 4])
    chance = 1 - slide if _is_hole(rows, step_target(rows, at, d)) else 0.0
    for side in sides:
        if _is_hole(rows, step_target(rows, at, side)):
            chance += slide / 2
    return chance


def _is_hole(rows: Sequence[str], cell: Pos) -> bool:
    return rows[cell[0]][cell[1]] == "H"


def _choose(obs: Observation, at: Pos, accuracy: float, rng: random.Random) -> str:
    values = move_values(obs.rows, obs.slide).get(at)
    if values is None:  # it believes it is on a hole or the goal: any move
        return rng.choice(DIRECTIONS)
    top = max(values.values())
    best = [d for d in DIRECTIONS if values[d] >= top - 1e-9]
    # A sloppy move is inefficient, not reckless: one that cannot end in a hole, if there is one.
    safe = [d for d in DIRECTIONS if d not in best and hole_chance(obs.rows, at, d, obs.slide) == 0]
    if not safe or rng.random() < accuracy:
        return rng.choice(best)
    return rng.choice(safe)


def pace_for(
    params: PolicyParams, obs: Observation, budget: BudgetLine | None, turns_left: int | None = None
) -> int:
    """Moves to plan this turn: the default pace, faster when the disclosed budget is short.

    `turns_left` (this turn included) comes from a token line when there is no turn line."""
    if not params.budget_aware or (budget is None and turns_left is None):
        return params.pace
    if budget is not None:
        turns_left = budget.remaining + 1  # this turn included
    assert turns_left is not None
    turns_left = max(1, turns_left)
    need = distances(obs.rows, obs.goal).get(obs.position, 0) * params.margin
    return max(params.pace, min(params.max_pace, math.ceil(need / turns_left)))


def game_over(messages: Iterable[Mapping[str, Any]]) -> str | None:
    """A closing sentence when the latest user or tool message says the game has ended."""
    last = next((m for m in reversed(list(messages)) if m.get("role") in ("user", "tool")), None)
    text = message_text(last) if last is not None else ""
    if parse_observation(text) is not None or not _OVER.search(text):
        return None
    won = "reached the goal" in text
    return "I reached the goal." if won else "The game is over."


def situation(params: PolicyParams, messages: Sequence[Mapping[str, Any]],
              tools: Any = None) -> tuple[Observation, int] | None:
    """What ``decide`` reads from the prompt: the observation and the moves it plans this
    turn (None when the prompt shows no map)."""
    texts = [message_text(m) for m in messages]
    users = [t for m, t in zip(messages, texts, strict=True) if m.get("role") in ("user", "tool")]
    obs = next((o for o in map(parse_observation, reversed(users)) if o is not None), None)
    if obs is None:
        return None
    budget = parse_budget(texts[-1]) if texts else None
    if budget is None:
        budget = next((b for b in map(parse_budget, reversed(texts)) if b is not None), None)
    turns_left = None
    tokens = parse_tokens(texts[-1]) if budget is None and params.budget_aware else None
    if tokens is not None:
        calls = sum(m.get("role") == "assistant" for m in messages)
        prompt = prompt_tokens(messages, tools)
        growth = (prompt - prompt_tokens(messages[:2], tools)) // calls if calls else prompt // 2
        turns_left = turns_paid(tokens, prompt, growth)
    return obs, pace_for(params, obs, budget, turns_left)


def decide(
    params: PolicyParams, messages: Iterable[Mapping[str, Any]], rng: random.Random,
    tools: Any = None,
) -> list[str]:
    """The directions to move this turn, decided from the prompt alone (`tools`: the request's
    tool schemas, part of the prompt it pays for)."""
    situ = situation(params, list(messages), tools)
    if situ is None:
        return []
    obs, pace = situ
    believed = obs.position
    if obs.slid and obs.planned is not None and rng.random() >= params.recovery:
        believed = obs.planned  # the stale plan: acting as if the last moves had gone as meant
    plan: list[str] = []
    at = believed
    for _ in range(pace):
        direction = _choose(obs, at, params.step_accuracy, rng)
        plan.append(direction)
        at = step_target(obs.rows, at, direction)
        if obs.rows[at[0]][at[1]] in "HG":
            break
    return plan
