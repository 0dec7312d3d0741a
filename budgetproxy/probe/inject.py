"""Error states: the last tool result replaced by an error, or the last action by a wrong one."""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from budgetproxy.probe.states import SIDES, State, message_text, with_messages

DEFAULT_TOOL_ERROR = "Error: the tool call failed ({name}). Nothing was done."

# A scorer module's hook for --inject action: the state with its last action replaced by a
# wrong one (and what that action led to), or None when this state has none to replace.
ActionInjector = Callable[[State, random.Random], State | None]


def call_signature(call: Any) -> str | None:
    """name(arguments) of a tool call, arguments re-serialised so whitespace is no change."""
    if not isinstance(call, dict):
        return None
    fn = call.get("function") or {}
    name, args = fn.get("name"), fn.get("arguments")
    if not isinstance(name, str):
        return None
    try:
        args = json.dumps(json.loads(str(args)), sort_keys=True, separators=(",", ":"))
    except ValueError:
        args = str(args)
    return f"{name}({args})"


def action_signatures(action: Any) -> list[str]:
    calls = action.get("tool_calls") if isinstance(action, dict) else None
    return [s for s in map(call_signature, calls or []) if s is not None]


def observed_errors(states: Iterable[State], pattern: re.Pattern[str] | None) -> list[str]:
    """Tool-result texts in the logs that match the error pattern (to inject as they were)."""
    if pattern is None:
        return []
    found: dict[str, None] = {}
    for st in states:
        for m in st.conversation:
            if m.get("role") == "tool":
                text = message_text(m)
                if pattern.search(text):
                    found[text] = None
    return sorted(found)


def inject_tool_error(
    state: State, rng: random.Random, errors: Sequence[str] = (),
    template: str = DEFAULT_TOOL_ERROR,
) -> State | None:
    """The last tool result replaced by an error: one seen in the logs when there are, else the
    template (`{name}` is the tool's name). None when the state holds no tool result."""
    conv = [dict(m) for m in state.conversation]
    idx = next((i for i in range(len(conv) - 1, -1, -1) if conv[i].get("role") == "tool"), None)
    if idx is None:
        return None
    call_id = conv[idx].get("tool_call_id")
    failed = None
    for m in reversed(conv[:idx]):
        if m.get("role") == "assistant":
            for call in m.get("tool_calls") or []:
                if isinstance(call, dict) and call.get("id") == call_id:
                    failed = call
            break
    name = ((failed or {}).get("function") or {}).get("name") or "tool"
    text = rng.choice(list(errors)) if errors else template.format(name=name)
    conv[idx]["content"] = text
    return with_messages(state, conv, "tool-error", call_signature(failed))


def matched_injections(
    sampled: Sequence[State], pools: Mapping[str, Mapping[str, Sequence[State]]],
    inject: Callable[[State], State | None], rng: random.Random,
) -> tuple[list[State], int, int]:
    """Error states in equal numbers from each policy's trajectories, task by task.

    Per task and policy, errors go into its sampled states first, then into the rest of its
    pool (in a seeded order) until as many took one as were sampled: a state that cannot take
    one (a first turn holds no tool result to fail) is replaced, not lost. Each task then
    keeps as many from each policy as the one with fewer has. Returns the states, how many
    tried could take no error, and how many were dropped for want of a counterpart."""
    by: dict[tuple[str, str], list[State]] = {}
    for st in sampled:
        by.setdefault((st.task_id, st.source), []).append(st)
    made: dict[tuple[str, str], list[State]] = {}
    not_injectable = 0
    for (task, side), mine in sorted(by.items()):
        keys = {st.key for st in mine}
        rest = sorted((st for st in pools.get(side, {}).get(task, ()) if st.key not in keys),
                      key=State.order)
        rng.shuffle(rest)
        got: list[State] = []
        for st in [*mine, *rest]:
            if len(got) == len(mine):
                break
            new = inject(st)
            if new is None:
                not_injectable += 1
            else:
                got.append(new)
        made[(task, side)] = got
    out: list[State] = []
    unmatched = 0
    for task in sorted({task for task, _ in made}):
        keep = min(len(made.get((task, side), [])) for side in SIDES)
        for side in SIDES:
            mine = made.get((task, side), [])
            out += mine[:keep]
            unmatched += len(mine) - keep
    return out, not_injectable, unmatched


def corrected(state: State, action: Any) -> bool | None:
    """Whether the next action fixes or abandons the failed call (does not repeat it as it
    was); None when the state names no failed call."""
    if state.failed_call is None:
        return None
    return state.failed_call not in action_signatures(action)
