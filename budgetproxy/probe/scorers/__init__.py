"""Scorers: `module:function(state, action) -> float`, loaded by name with their optional hooks.

A scorer module may also define, beside the function:

- ``inject_action(state, rng) -> State | None`` — the state with its last action replaced by a
  wrong one, for ``--inject action``;
- ``continue_episode`` — a coroutine that plays a policy on from a state to the end of a new
  episode (see ``budgetproxy.probe.continuation``), for ``--continue``;
- ``ERROR_PATTERN`` — a regular expression for states that already hold an error, used when
  ``--error-pattern`` is not given.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from budgetproxy.probe.inject import ActionInjector
from budgetproxy.probe.states import State

ScoreFn = Callable[[State, dict[str, Any]], float]

BUILT_IN = {
    "frozenlake": "budgetproxy.probe.scorers.frozenlake:score",
    "command": "budgetproxy.probe.scorers.command:score",
}


class ScorerError(ValueError):
    """A scorer that cannot be loaded (said in one line)."""


@dataclass(frozen=True)
class Scorer:
    """A loaded scorer and the hooks its module offers."""

    name: str
    score: ScoreFn
    inject_action: ActionInjector | None = None
    continue_episode: Callable[..., Any] | None = None
    error_pattern: str | None = None


def load_scorer(spec: str, command: str | None = None, timeout_s: float = 60.0) -> Scorer:
    """`frozenlake`, `command` (with `command`), or `module:function`."""
    target = BUILT_IN.get(spec, spec)
    module_name, sep, func_name = target.partition(":")
    if not sep or not module_name or not func_name:
        raise ScorerError(f"--scorer: expected frozenlake, command or MODULE:FUNC, got {spec!r}")
    if spec == "command":
        from budgetproxy.probe.scorers.command import CommandScorer

        if not command:
            raise ScorerError("--scorer command needs --command 'CMD' (run once per action)")
        return Scorer(name=f"command: {command}", score=CommandScorer(command, timeout_s))
    try:
        module: ModuleType = importlib.import_module(module_name)
    except ImportError as e:
        raise ScorerError(f"--scorer: cannot import {module_name!r}: {e}") from None
    fn = getattr(module, func_name, None)
    if not callable(fn):
        raise ScorerError(f"--scorer: {module_name} has no function {func_name!r}")
    pattern = getattr(module, "ERROR_PATTERN", None)
    return Scorer(
        name=spec,
        score=fn,
        inject_action=getattr(module, "inject_action", None),
        continue_episode=getattr(module, "continue_episode", None),
        error_pattern=pattern if isinstance(pattern, str) else None,
    )
