"""Compaction calls of Claude Code and Codex CLI, in the shapes those CLIs send them, through
the real proxy with the official clients: free ones are forwarded uncharged, with no budget
text, and logged as "compaction" records; counted ones are turns."""

from __future__ import annotations

from typing import Any

import anthropic
import pytest

from budgetproxy.testing import FakeUpstream
from tests.conftest import Proxy, ProxyFactory, new_id

TEMPLATE = "[Turn budget] Turn {turn} of {total}."
# The prompts as Claude Code 2.1.197 and Codex CLI 0.171.0 sent them (their first lines).
CLAUDE_COMPACT = (
    "CRITICAL: Respond with TEXT ONLY. Do NOT call any tools.\n\n- Do NOT use Read, Bash, Grep, "
    "Glob, Edit, Write, or ANY other tool.\n\nYour task is to create a detailed summary of the "
    "conversation so far, paying close attention to the user's explicit requests and your "
    "previous actions.\n")
CODEX_COMPACT = (
    "You are performing a CONTEXT CHECKPOINT COMPACTION. Create a handoff summary for another "
    "LLM that will resume the task.\n\nInclude:\n- Current progress and key decisions made\n")


def compacting(proxy: ProxyFactory, mode: str = "free") -> Proxy:
    return proxy({"disclosure": {"mode": "disclosed", "template": TEMPLATE},
                  "episodes": {"id_header_presets": ["claude_code", "codex"],
                               "compaction": mode}})


def anthropic_client(p: Proxy, sid: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=p.url, api_key="sk-client", max_retries=0, timeout=20.0,
                               default_headers={"X-Claude-Code-Session-Id": sid,
                                                "X-Test-Episode": sid, "X-Episode-Budget": "4"})


def sent(upstream: FakeUpstream, eid: str, path: str) -> list[dict[str, Any]]:
    return [r.json for r in upstream.requests
            if r.path == path and r.headers.get("x-test-episode") == eid]


def claude_session(p: Proxy, sid: str) -> None:
    """A turn, Claude Code's /compact, and a turn after it on the summary."""
    c = anthropic_client(p, sid)
    first = [{"role": "user", "content": "fix the test"}]
    c.messages.create(model="m1", max_tokens=32, system="sys", messages=first)
    compact = [{"role": "user", "content": [{"type": "text", "text": "fix the test"}]},
               {"role": "assistant", "content": [{"type": "text", "text": "done"}]},
               {"role": "user", "content": [{"type": "text", "text": "and again\n"},
                                            {"type": "text", "text": CLAUDE_COMPACT}]}]
    c.messages.create(model="m1", max_tokens=32, system="sys", messages=compact)
    after = [{"role": "user", "content": [{"type": "text", "text": "Summary: fixed."}]},
             {"role": "assistant", "content": [{"type": "text", "text": "ok"}]},
             {"role": "user", "content": [{"type": "text", "text": "next"}]}]
    c.messages.create(model="m1", max_tokens=32, system="sys", messages=after)


def test_claude_code_compaction_is_free_untold_and_logged(
        proxy: ProxyFactory, upstream: FakeUpstream) -> None:
    p = compacting(proxy)
    sid = new_id("cc")
    claude_session(p, sid)
    bodies = sent(upstream, sid, "/v1/messages")
    assert len(bodies) == 3
    assert "[Turn budget]" not in str(bodies[1]["messages"])  # forwarded as sent
    assert bodies[2]["messages"][-1]["content"][-1]["text"] == "[Turn budget] Turn 2 of 4."
    ep = p.episode(sid)
    assert (ep["turns_used"], ep["remaining"]) == (2, 2)
    turns = p.wait_records(2, type="turn", episode_id=sid)
    assert [t["turn"] for t in turns] == [1, 2]
    (rec,) = p.wait_records(1, type="compaction", episode_id=sid)
    assert rec["charged"] is False and rec["http_status"] == 200
    assert rec["route"] == "/v1/messages" and rec["system"] == "sys"
    assert rec["request_messages"][-1]["content"][-1]["text"] == CLAUDE_COMPACT
    assert rec["response"]["content"].startswith("echo: ")


def test_codex_compaction_is_free_untold_and_logged(
        proxy: ProxyFactory, upstream: FakeUpstream) -> None:
    p = compacting(proxy)
    sid = new_id("cx")
    c = p.client(default_headers={"session-id": sid, "X-Test-Episode": sid,
                                  "X-Episode-Budget": "4"})
    items: list[Any] = [{"type": "message", "role": "user",
                         "content": [{"type": "input_text", "text": "fix the test"}]}]
    c.responses.create(model="m1", input=items, stream=False)
    items += [{"type": "message", "role": "assistant", "content": [
                  {"type": "output_text", "text": "done", "annotations": []}]},
              {"type": "message", "role": "user",
               "content": [{"type": "input_text", "text": CODEX_COMPACT}]}]
    with c.responses.stream(model="m1", input=items) as s:  # Codex streams every call
        s.get_final_response()
    bodies = sent(upstream, sid, "/v1/responses")
    assert bodies[1]["input"][-1]["content"] == [{"type": "input_text", "text": CODEX_COMPACT}]
    assert p.episode(sid)["turns_used"] == 1
    (rec,) = p.wait_records(1, type="compaction", episode_id=sid)
    assert rec["stream"] is True and rec["usage"]["input_tokens"] > 0
    assert len(p.records(type="turn", episode_id=sid)) == 1


def test_counted_compaction_is_a_turn_marked_in_its_record(
        proxy: ProxyFactory, upstream: FakeUpstream) -> None:
    p = compacting(proxy, "counted")
    sid = new_id("cc")
    claude_session(p, sid)
    bodies = sent(upstream, sid, "/v1/messages")
    assert bodies[1]["messages"][-1]["content"][-1]["text"] == "[Turn budget] Turn 2 of 4."
    assert p.episode(sid)["turns_used"] == 3
    turns = sorted(p.wait_records(3, type="turn", episode_id=sid), key=lambda r: r["turn"])
    assert [t.get("compaction", False) for t in turns] == [False, True, False]
    assert p.records(type="compaction", episode_id=sid) == []


@pytest.mark.parametrize("presets", [[], ["codex"]])
def test_without_its_preset_a_summary_request_is_a_turn(
        proxy: ProxyFactory, upstream: FakeUpstream, presets: list[str]) -> None:
    """Claude Code's prompt is recognised only under the claude_code preset (an agent that
    asks its model for a summary as a step of its task spends a turn)."""
    p = proxy({"disclosure": {"mode": "disclosed", "template": TEMPLATE},
               "episodes": {"compaction_presets": presets}})
    sid = new_id("cc")
    c = anthropic.Anthropic(base_url=p.url, api_key="sk-client", max_retries=0, timeout=20.0,
                            default_headers={"X-Episode-Id": sid, "X-Test-Episode": sid})
    c.messages.create(model="m1", max_tokens=32, messages=[
        {"role": "user", "content": CLAUDE_COMPACT}])
    assert p.episode(sid)["turns_used"] == 1
    assert "[Turn budget] Turn 1" in str(sent(upstream, sid, "/v1/messages")[-1])
