"""Scorers the probe tests load by name (`probe_scorers:FUNC`)."""

from __future__ import annotations

from typing import Any


def prefers_a(state: Any, action: dict[str, Any]) -> float:
    """1 for a reply from model m-a (the labelled upstream names its model), else 0."""
    return 1.0 if "model=m-a" in str(action.get("content")) else 0.0


def broken(state: Any, action: dict[str, Any]) -> float:
    raise RuntimeError("this scorer always fails")
