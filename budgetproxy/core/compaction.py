"""Compaction calls: the summary requests agent CLIs send to shorten their own history.

A CLI compacts by asking the model for a summary of the conversation so far, in one call of
the same API on the same session. Such a call is no step of the task, so (episodes.compaction:
free) it is forwarded without spending a turn or getting a budget text. Each preset matches the
exact request its CLI sends (docs/agents.md), by the text it appends as the last user message.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

# The request each preset recognises: its API, and a text its compaction prompt holds in the
# last user message's text (Claude Code 2.1.197's /compact and auto-compact; Codex CLI
# 0.171.0's "CONTEXT CHECKPOINT COMPACTION", local and automatic alike).
MARKS: dict[str, tuple[str, str, bool]] = {
    # preset: (dialect kind, text, True: the text starts a block; False: anywhere in one)
    "claude_code": ("messages", "Your task is to create a detailed summary of the "
                                "conversation so far", False),
    "codex": ("responses", "You are performing a CONTEXT CHECKPOINT COMPACTION.", True),
}


def recognisers(presets: Iterable[str], kind: str) -> tuple[tuple[str, bool], ...]:
    """The (text, at start) marks the given presets match on calls of dialect `kind`."""
    return tuple((text, start) for p in presets if p in MARKS
                 for k, text, start in [MARKS[p]] if k == kind)


def _texts(content: Any) -> list[str]:
    if isinstance(content, str):
        return [content]
    if not isinstance(content, list):
        return []
    return [b["text"] for b in content if isinstance(b, dict)
            and b.get("type") in ("text", "input_text") and isinstance(b.get("text"), str)]


def is_compaction(conversation: list[Any], marks: tuple[tuple[str, bool], ...]) -> bool:
    """Whether the conversation's last item is a user message holding a mark's text."""
    if not marks or not conversation:
        return False
    last = conversation[-1]
    if not isinstance(last, dict) or last.get("role") != "user":
        return False
    for text in _texts(last.get("content")):
        for mark, start in marks:
            if text.startswith(mark) if start else mark in text:
                return True
    return False
