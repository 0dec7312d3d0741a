"""Scorers the probe tests load by name (`probe_scorers:FUNC`)."""

from __future__ import annotations

from typing import Any


def prefers_a(state: Any, action: dict[str, Any]) -> float:
    """1 for a reply from model m-a (the labelled upstream names its model), else 0."""
    return 1.0 if "model=m-a" in str(action.get("content")) else 0.0


def broken(state: Any, action: dict[str, Any]) -> float:
    raise RuntimeError("this scorer always fails")


# probe --over: the step a reply's model names (m-<step>) must reach the state's task's bar
STEP_BARS = {"t1": 1, "t2": 5, "t3": 50}


def by_step(state: Any, action: dict[str, Any]) -> float:
    """1 when the model's step reaches the bar of the state's task, else 0."""
    step = int(str(action.get("content")).rsplit("-", 1)[1])
    return 1.0 if step >= STEP_BARS[state.task_id] else 0.0


def as_logged(state: Any, action: dict[str, Any]) -> float:
    """1 when the reply is the one the state's own turn got. Behind an upstream that echoes
    the request it saw, that is: the replay sent the model exactly what it saw then."""
    logged = (state.action or {}).get("content")
    return 1.0 if action.get("content") == logged and logged else 0.0
