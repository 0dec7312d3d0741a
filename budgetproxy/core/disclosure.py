"""Disclosure: render the remaining-budget text and place it in the conversation."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

Placement = Literal["last_message", "system", "new_message"]


def render(template: str, turn: int, budget: int, announced_budget: int | None) -> str:
    total = announced_budget if announced_budget is not None else budget
    return template.format(turn=turn, total=total, remaining=max(0, total - turn), used=turn - 1)


def placement_index(placement: Placement, message_count: int) -> int | None:
    """The client-message index a turn's text attaches to; None for `system` (not replayed)."""
    if placement == "last_message":
        return message_count - 1
    if placement == "new_message":
        return message_count  # inserted before the client message at this index
    return None


def _append_text(message: dict[str, Any], text: str) -> dict[str, Any]:
    out = dict(message)
    content = message.get("content")
    if isinstance(content, list):
        out["content"] = [*content, {"type": "text", "text": text}]
    elif isinstance(content, str) and content:
        out["content"] = content + "\n\n" + text
    else:
        out["content"] = text
    return out


def apply(
    messages: list[Any],
    placement: Placement,
    text: str,
    earlier: Iterable[tuple[int, str]] = (),
) -> list[Any]:
    """A new message list with this turn's text placed, and earlier turns' texts re-applied.

    `earlier` holds (index, text) of previous turns (history: keep); entries that no longer fit
    the conversation (the client rewrote its history) are skipped. Messages not touched are the
    client's own objects, so nothing but the placements changes.
    """
    n = len(messages)
    if placement == "system":
        for i, m in enumerate(messages):
            if isinstance(m, dict) and m.get("role") == "system":
                return [*messages[:i], _append_text(m, text), *messages[i + 1 :]]
        return [{"role": "system", "content": text}, *messages]
    if placement == "last_message":
        out = list(messages)
        for idx, old in earlier:
            if 0 <= idx < n - 1 and isinstance(out[idx], dict):
                out[idx] = _append_text(out[idx], old)
        out[n - 1] = _append_text(out[n - 1], text)
        return out
    inserts: dict[int, str] = {idx: old for idx, old in earlier if 0 <= idx < n}
    inserts[n] = text
    out = []
    for i in range(n + 1):
        if i in inserts:
            out.append({"role": "user", "content": inserts[i]})
        if i < n:
            out.append(messages[i])
    return out
