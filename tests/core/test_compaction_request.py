"""Compaction calls: each preset matches its CLI's summary request, and nothing else."""

from __future__ import annotations

from typing import Any

import pytest

from budgetproxy.core.compaction import is_compaction, recognisers

CLAUDE = ("CRITICAL: Respond with TEXT ONLY. Do NOT call any tools.\n\nYour task is to create a "
          "detailed summary of the conversation so far, paying close attention to ...")
CODEX = "You are performing a CONTEXT CHECKPOINT COMPACTION. Create a handoff summary ..."


def user(*texts: str, kind: str = "text") -> dict[str, Any]:
    return {"role": "user", "content": [{"type": kind, "text": t} for t in texts]}


@pytest.mark.parametrize(("presets", "kind", "last", "expected"), [
    (["claude_code"], "messages", user("and again\n", CLAUDE), True),
    (["claude_code"], "messages", {"role": "user", "content": CLAUDE}, True),
    (["claude_code"], "responses", user(CLAUDE, kind="input_text"), False),  # not its API
    (["codex"], "messages", user(CLAUDE), False),  # not its preset
    ([], "messages", user(CLAUDE), False),
    (["codex"], "responses", {"type": "message", "role": "user",
                              "content": [{"type": "input_text", "text": CODEX}]}, True),
    (["codex"], "responses", user("quote: " + CODEX, kind="input_text"), False),  # not first
    (["codex", "claude_code"], "responses", {"role": "assistant", "content": CODEX}, False),
    (["claude_code"], "messages", user("fix the test"), False),
])
def test_each_preset_matches_its_clis_request(
        presets: list[str], kind: str, last: dict[str, Any], expected: bool) -> None:
    convo = [{"system": "sys"}, {"role": "user", "content": "hi"}, last]
    assert is_compaction(convo, recognisers(presets, kind)) is expected


def test_an_empty_conversation_or_no_marks_is_no_compaction() -> None:
    assert not is_compaction([], recognisers(["claude_code"], "messages"))
    assert not is_compaction([user(CLAUDE)], ())
