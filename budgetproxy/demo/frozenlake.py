"""FrozenLake tasks for the demo: maps, full budgets, and the observation text an agent sends.

The environment itself is gymnasium's ``FrozenLake-v1`` (imported lazily). This module owns
what the model sees: the map, the position, and what happened to the last moves, written as
plain text. The simulated policies parse exactly this text and nothing else.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

DIRECTIONS = ("left", "down", "right", "up")  # gymnasium's action order: 0..3
_DELTA = {"left": (0, -1), "down": (1, 0), "right": (0, 1), "up": (-1, 0)}

Pos = tuple[int, int]

# The most moves the agent runs from one reply; later ones are not made. No simulated policy
# plans more (budget-aware's fastest pace is 4), and it makes a task's fewest turns a
# property of its map (`min_turns`), not 1 for every map.
MOVES_PER_TURN = 4


@dataclass(frozen=True)
class Task:
    """One FrozenLake map with its full turn budget (``max_turns``)."""

    task_id: str
    rows: tuple[str, ...]
    slippery: bool
    max_turns: int
    # Probability a move on slippery ice goes where intended; each sideways slide has half the rest.
    success_rate: float = 0.75

    @property
    def start(self) -> Pos:
        return find(self.rows, "S")

    @property
    def goal(self) -> Pos:
        return find(self.rows, "G")


_MAP_4X4 = ("SFFF", "FHFH", "FFFH", "HFFG")
_MAP_8X8 = (
    "SFFFFFFF",
    "FFFFFFFF",
    "FFFHFFFF",
    "FFFFFHFF",
    "FFFHFFFF",
    "FHHFFFHF",
    "FHFFHFHF",
    "FFFHFFFG",
)

# Full budgets leave room for mistakes: about twice the turns a sloppy but safe agent needs.
TASKS: tuple[Task, ...] = (
    Task("4x4", _MAP_4X4, slippery=False, max_turns=16),
    Task("4x4-slippery", _MAP_4X4, slippery=True, max_turns=32),
    Task("8x8", _MAP_8X8, slippery=False, max_turns=48),
    Task("8x8-slippery", _MAP_8X8, slippery=True, max_turns=64),
)
QUICK_TASKS: tuple[Task, ...] = (TASKS[0], TASKS[1])

# More slippery 4x4 lakes, so the demo's claims rest on enough tasks for their intervals over
# tasks to mean something. Drawn once (holes with probability 0.2, kept when the goal is
# reachable and the lake has at least two holes) and written down, so every run meets the same.
_LAKES = (
    ("SHFF", "FFFF", "FFHF", "FFFG"), ("SFFF", "FFFH", "FFHF", "HFFG"),
    ("SFFF", "FFHH", "FFFF", "FFFG"), ("SFFH", "FHFF", "HFHF", "FFFG"),
    ("SHFF", "FFFF", "FFFH", "FFFG"), ("SHFF", "FFHF", "FFFF", "FHFG"),
    ("SFFH", "FFHF", "FFFF", "FFFG"), ("SFFF", "FFFF", "HHFF", "FFHG"),
    ("SFHF", "FFFF", "FFFF", "FHFG"), ("SFFH", "FFFF", "FFFF", "FFHG"),
)  # fmt: skip
LAKES: tuple[Task, ...] = tuple(
    Task(f"lake-{i}", rows, slippery=True, max_turns=32) for i, rows in enumerate(_LAKES, 1)
)


def find(rows: Sequence[str], letter: str) -> Pos:
    for r, row in enumerate(rows):
        c = row.find(letter)
        if c >= 0:
            return (r, c)
    raise ValueError(f"map has no {letter!r}")


def shortest_safe_path(rows: Sequence[str]) -> int | None:
    """The fewest moves from S to G that never enter a hole (breadth-first search over the
    map; a move into the edge stays put), or None when holes cut G off. On slippery ice
    this is still the fewest: every move can go as intended."""
    start, goal = find(rows, "S"), find(rows, "G")
    seen = {start: 0}
    queue = deque([start])
    while queue:
        cell = queue.popleft()
        if cell == goal:
            return seen[cell]
        for direction in DIRECTIONS:
            nxt = step_target(rows, cell, direction)
            if nxt not in seen and rows[nxt[0]][nxt[1]] != "H":
                seen[nxt] = seen[cell] + 1
                queue.append(nxt)
    return None


def min_turns(task: Task) -> int | None:
    """The fewest turns the task can be solved in: its shortest safe path, MOVES_PER_TURN
    moves a turn (sent as X-Episode-Min-Turns, for `analyze --ceiling`)."""
    path = shortest_safe_path(task.rows)
    return None if path is None else max(1, math.ceil(path / MOVES_PER_TURN))


def step_target(rows: Sequence[str], pos: Pos, direction: str) -> Pos:
    """Where a move lands if it goes as intended (walls stop it)."""
    dr, dc = _DELTA[direction]
    r = min(max(pos[0] + dr, 0), len(rows) - 1)
    c = min(max(pos[1] + dc, 0), len(rows[0]) - 1)
    return (r, c)


@dataclass
class MoveResult:
    direction: str
    start: Pos
    end: Pos
    slid: bool
    cell: str  # the letter at `end`

    def text(self) -> str:
        frm = f"({self.start[0]},{self.start[1]})"
        to = f"({self.end[0]},{self.end[1]})"
        if self.slid:
            line = f"move {self.direction} from {frm}: slid on the ice to {to}"
        else:
            line = f"move {self.direction} from {frm}: moved to {to}"
        if self.cell == "H":
            line += ", fell into a hole"
        elif self.cell == "G":
            line += ", reached the goal"
        return line


@dataclass
class Game:
    """A running FrozenLake-v1 episode, seeded, stepping one direction at a time."""

    task: Task
    seed: int
    pos: Pos = (0, 0)
    done: bool = False
    won: bool = False
    moves: int = 0
    _env: Any = field(default=None, repr=False)

    def __post_init__(self) -> None:
        import gymnasium as gym

        self._env = gym.make(
            "FrozenLake-v1",
            desc=list(self.task.rows),
            is_slippery=self.task.slippery,
            success_rate=self.task.success_rate,
            max_episode_steps=100_000,
        )
        state, _ = self._env.reset(seed=self.seed)
        self.pos = divmod(int(state), len(self.task.rows[0]))

    def move(self, direction: str) -> MoveResult:
        if self.done:
            raise RuntimeError("the game is over")
        start = self.pos
        state, reward, terminated, truncated, _ = self._env.step(DIRECTIONS.index(direction))
        self.pos = divmod(int(state), len(self.task.rows[0]))
        self.moves += 1
        cell = self.task.rows[self.pos[0]][self.pos[1]]
        self.done = bool(terminated or truncated)
        self.won = bool(reward > 0)
        slid = self.pos != step_target(self.task.rows, start, direction)
        return MoveResult(direction, start, self.pos, slid, cell)

    def close(self) -> None:
        self._env.close()


SYSTEM_PROMPT = (
    "You are playing FrozenLake. Walk from S to G across the frozen lake without falling into "
    "a hole (H). Use the move tool; you may call it several times in one reply to plan ahead, "
    "and the moves run in order. Positions are (row,col), row 0 at the top."
)

MOVE_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "move",
        "description": "Move one cell on the lake.",
        "parameters": {
            "type": "object",
            "properties": {"direction": {"type": "string", "enum": list(DIRECTIONS)}},
            "required": ["direction"],
            "additionalProperties": False,
        },
    },
}


def observation(task: Task, pos: Pos, last_moves: list[MoveResult]) -> str:
    """The user message for one turn: the map, where the agent is, what its last moves did."""
    if task.slippery:
        percent = round(100 * (1 - task.success_rate))
        ice = f"slippery: {percent}% of moves slide sideways, half to each side"
    else:
        ice = "not slippery"
    lines = [
        f"FrozenLake map {task.task_id} ({ice}). S start, F frozen, H hole, G goal.",
        *task.rows,
        f"You are at ({pos[0]},{pos[1]}). The goal is at ({task.goal[0]},{task.goal[1]}).",
    ]
    if last_moves:
        lines.append("Last moves:")
        lines.extend(f"- {m.text()}" for m in last_moves)
    else:
        lines.append("Last moves: none yet.")
    lines.append("Which way next?")
    return "\n".join(lines)
