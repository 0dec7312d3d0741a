"""The command scorer: a user command run once per action, scored by its exit code or pass rate.

The command runs through the shell with the state and action as JSON on stdin
(``{"state": {task_id, episode_id, turn, messages}, "action": {content, tool_calls}}``) and
the action's text in ``BUDGETPROXY_PROBE_ACTION``. Its score is, in this order: the last line
of its output when that is a number in [0, 1]; the pass rate of a pytest-style summary
(``3 passed, 1 failed``); else exit code 0 → 1.0 and 1 → 0.0. Any other exit code, a
signal, a timeout or a command that cannot start is a scorer failure: the probe reports it
and goes on without that action.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from typing import Any

from budgetproxy.probe.states import State

_SUMMARY = re.compile(r"(\d+) (passed|failed|error|errors)\b")


class ScorerFailed(RuntimeError):
    """The command could not score this action."""


def pass_rate(output: str) -> float | None:
    """A score the output states: a number in [0, 1] on its last line, or a pass rate."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    if lines:
        try:
            value = float(lines[-1])
        except ValueError:
            value = -1.0
        if 0.0 <= value <= 1.0:
            return value
    counts = {"passed": 0, "failed": 0}
    for n, word in _SUMMARY.findall(output):
        counts["passed" if word == "passed" else "failed"] += int(n)
    total = counts["passed"] + counts["failed"]
    return counts["passed"] / total if total else None


class CommandScorer:
    """`score(state, action)` by running `command` (see the module text)."""

    def __init__(self, command: str, timeout_s: float = 60.0) -> None:
        self.command = command
        self.timeout_s = timeout_s

    def __call__(self, state: State, action: dict[str, Any]) -> float:
        payload = json.dumps({
            "state": {"task_id": state.task_id, "episode_id": state.episode_id,
                      "turn": state.turn, "messages": list(state.conversation)},
            "action": action,
        })
        text = action.get("content") if isinstance(action.get("content"), str) else ""
        env = {**os.environ, "BUDGETPROXY_PROBE_ACTION": text or json.dumps(
            action.get("tool_calls") or [])}
        try:
            done = subprocess.run(self.command, shell=True, input=payload, text=True,
                                  capture_output=True, timeout=self.timeout_s, env=env)
        except subprocess.TimeoutExpired:
            raise ScorerFailed(f"timed out after {self.timeout_s:g}s") from None
        except OSError as e:
            raise ScorerFailed(f"could not start: {e}") from None
        stated = pass_rate(done.stdout)
        if stated is not None and done.returncode in (0, 1):
            return stated
        if done.returncode == 0:
            return 1.0
        if done.returncode == 1:
            return 0.0
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or [""]
        raise ScorerFailed(f"exit code {done.returncode}: {tail[0][:200]}")


def score(state: State, action: dict[str, Any]) -> float:
    """Placeholder for the name `command`; the command comes from --command."""
    raise ScorerFailed("the command scorer needs a command (--scorer command --command CMD)")
