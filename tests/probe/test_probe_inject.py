"""Injected error states: equal numbers per policy and task, and what could not be matched."""

from __future__ import annotations

import random
from collections import Counter
from types import SimpleNamespace
from typing import Any

from budgetproxy.probe.run import error_states
from budgetproxy.probe.states import State

CALL = {"id": "c1", "type": "function", "function": {"name": "move", "arguments": "{}"}}


def _state(side: str, task: str, turn: int) -> State:
    """A state of turn `turn`; a first turn holds no tool result to put an error in."""
    conv: tuple[dict[str, Any], ...] = ({"role": "user", "content": "go"},)
    if turn > 1:
        conv += ({"role": "assistant", "content": None, "tool_calls": [CALL]},
                 {"role": "tool", "tool_call_id": "c1", "content": f"moved {turn}"})
    return State(task_id=task, source=side, episode_id=f"{side}-{task}-{turn}", turn=turn,
                 fraction=turn / 9, conversation=conv, messages=conv, disclosure="hidden",
                 budget=9, max_turns=9, remaining=9 - turn + 1)


def test_injected_states_are_balanced_per_policy_and_task() -> None:
    # t1: three of A's four sampled states are first turns; A's pool holds two more it can
    # take; B's four sampled states all take one. t2: B has no injectable state at all.
    plain = ([_state("a", "t1", t) for t in (1, 1, 1, 2)] + [_state("b", "t1", t)
                                                             for t in (2, 3, 4, 5)]
             + [_state("a", "t2", 2), _state("b", "t2", 1)])
    # (first turns of different episodes: give them distinct ids)
    plain = [State(**{**s.__dict__, "episode_id": f"{s.episode_id}-{i}"})
             for i, s in enumerate(plain)]
    pools = {"a": {"t1": [*(s for s in plain if s.source == "a" and s.task_id == "t1"),
                          _state("a", "t1", 6), _state("a", "t1", 7)],
                   "t2": [plain[8]]},
             "b": {"t1": [s for s in plain if s.source == "b" and s.task_id == "t1"],
                   "t2": [plain[9]]}}
    opts = SimpleNamespace(inject="tool-error", tool_error=None, scorer=None)
    states, counts = error_states(opts, plain, pools, [], None,  # type: ignore[arg-type]
                                  random.Random(0))
    by = Counter((s.task_id, s.source) for s in states)
    assert by == {("t1", "a"): 3, ("t1", "b"): 3}
    assert all(s.injected == "tool-error" for s in states)
    # four states could take no error (three first turns of A in t1, B's first turn in t2);
    # one of B's t1 states and A's t2 state had no counterpart of the other policy
    assert counts == {"not_injectable": 4, "injected_unmatched": 2}
