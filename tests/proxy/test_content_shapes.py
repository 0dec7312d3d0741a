"""A message flipped between string content and one text block is the same message: on every
API, through the real proxy with the official clients, the earlier turns' disclosure texts
stay where they were and the upstream's prompt stays append-only (modulo the shape the client
sent), and the turn records hold only what is new."""

from __future__ import annotations

from typing import Any

import anthropic
import pytest

from budgetproxy.core.fingerprint import canonical
from budgetproxy.testing import FakeUpstream
from tests.conftest import Proxy, ProxyFactory, new_id, unmarked

TEMPLATE = "[Turn budget] Turn {turn} of {total}."
EPHEMERAL = {"type": "ephemeral"}
TURNS = 5


def told(turn: int) -> str:
    return f"[Turn budget] Turn {turn} of 9."


def disclosed(proxy: ProxyFactory) -> Proxy:
    return proxy({"disclosure": {"mode": "disclosed", "template": TEMPLATE, "history": "keep"}})


def shaped(text: str, turn: int, block: str, marked: bool) -> Any:
    """`text` as a string on odd turns, as one text block on even ones."""
    if turn % 2:
        return text
    b: dict[str, Any] = {"type": block, "text": text}
    if marked:
        b["cache_control"] = EPHEMERAL
    return [b]


def sent(upstream: FakeUpstream, eid: str, path: str) -> list[dict[str, Any]]:
    return [r.json for r in upstream.requests
            if r.path == path and r.headers.get("x-test-episode") == eid]


def assert_append_only(prompts: list[list[Any]]) -> None:
    """Each upstream prompt starts with the one before it (in canonical shape, markers
    aside), and the last holds every turn's text exactly once."""
    assert len(prompts) == TURNS
    flat = [canonical(unmarked(p)) for p in prompts]
    breaks = [t for t, (a, b) in enumerate(zip(flat, flat[1:], strict=False), 2)
              if b[: len(a)] != a]
    assert breaks == [], f"append-only broken at turns {breaks}"
    last = str(flat[-1])
    dropped = [t for t in range(1, TURNS + 1) if last.count(told(t)) != 1]
    assert dropped == [], f"disclosure texts of turns {dropped} missing or repeated"


def assert_only_new_logged(p: Proxy, eid: str, per_turn: int) -> None:
    recs = sorted(p.wait_records(TURNS, type="turn", episode_id=eid), key=lambda r: r["turn"])
    assert [r["turn"] for r in recs] == list(range(1, TURNS + 1))
    for r in recs[1:]:
        assert len(r["request_messages"]) == per_turn, r
    assert [r["messages_offset"] for r in recs[1:]] == [
        per_turn * t - (per_turn - 1) for t in range(1, TURNS)]


def test_chat_messages_flipping_shape_keep_their_texts(
        proxy: ProxyFactory, upstream: FakeUpstream) -> None:
    p = disclosed(proxy)
    eid = new_id()
    c = p.client(default_headers={"X-Episode-Id": eid, "X-Test-Episode": eid,
                                  "X-Episode-Budget": "9"})
    for turn in range(1, TURNS + 1):
        msgs: list[Any] = []
        for t in range(1, turn + 1):
            msgs.append({"role": "user", "content": shaped(f"u{t}", turn, "text", t == turn)})
            if t < turn:
                msgs.append({"role": "assistant", "content": f"a{t}"})
        c.chat.completions.create(model="m1", messages=msgs)
    prompts = [b["messages"] for b in sent(upstream, eid, "/v1/chat/completions")]
    assert_append_only(prompts)
    # One text block takes the text into its own text, as a string does.
    assert prompts[1][0]["content"] == [{"type": "text", "text": "u1\n\n" + told(1)}]
    assert prompts[2][0]["content"] == "u1\n\n" + told(1)
    assert_only_new_logged(p, eid, 2)


def test_responses_items_flipping_shape_keep_their_texts(
        proxy: ProxyFactory, upstream: FakeUpstream) -> None:
    p = disclosed(proxy)
    eid = new_id()
    c = p.client(default_headers={"X-Episode-Id": eid, "X-Test-Episode": eid,
                                  "X-Episode-Budget": "9"})
    c.responses.create(model="m1", input="u1", instructions="sys")  # a bare string first
    for turn in range(2, TURNS + 1):
        items: list[Any] = []
        for t in range(1, turn + 1):
            item: dict[str, Any] = {"role": "user",
                                    "content": shaped(f"u{t}", turn, "input_text", False)}
            if turn % 2 == 0:
                item["type"] = "message"
            items.append(item)
            if t < turn:
                items.append({"type": "message", "role": "assistant", "content": [
                    {"type": "output_text", "text": f"a{t}", "annotations": []}]})
        c.responses.create(model="m1", input=items, instructions="sys")
    bodies = sent(upstream, eid, "/v1/responses")
    prompts = [[{"instructions": b["instructions"]},
                *([{"role": "user", "content": b["input"]}] if isinstance(b["input"], str)
                  else b["input"])] for b in bodies]
    assert_append_only(prompts)
    assert bodies[1]["input"][0]["content"] == [
        {"type": "input_text", "text": "u1\n\n" + told(1)}]
    assert_only_new_logged(p, eid, 2)


def test_messages_flipping_shape_with_moving_markers_keep_their_texts(
        proxy: ProxyFactory, upstream: FakeUpstream) -> None:
    """What Claude Code does: a prompt sent as a string on its first turn comes back as one
    text block, the newest one carrying cache_control."""
    p = disclosed(proxy)
    eid = new_id()
    c = anthropic.Anthropic(base_url=p.url, api_key="sk-client", max_retries=0, timeout=20.0,
                            default_headers={"X-Episode-Id": eid, "X-Test-Episode": eid,
                                             "X-Episode-Budget": "9"})
    for turn in range(1, TURNS + 1):
        msgs: list[Any] = []
        for t in range(1, turn + 1):
            msgs.append({"role": "user", "content": shaped(f"u{t}", turn, "text", t == turn)})
            if t < turn:
                msgs.append({"role": "assistant", "content": [{"type": "text", "text": f"a{t}"}]})
        c.messages.create(model="m1", max_tokens=32, system="sys", messages=msgs)
    bodies = sent(upstream, eid, "/v1/messages")
    assert_append_only([[{"system": b["system"]}, *b["messages"]] for b in bodies])
    assert unmarked(bodies[1]["messages"][0]["content"]) == [
        {"type": "text", "text": "u1"}, {"type": "text", "text": told(1)}]
    assert_only_new_logged(p, eid, 2)


@pytest.mark.parametrize("flip", ["string", "block"])
def test_a_tool_result_flipping_shape_is_the_same_message(flip: str) -> None:
    from budgetproxy.core.fingerprint import Fingerprint
    text_form: Any = "a key"
    block_form: Any = [{"type": "text", "text": "a key", "cache_control": EPHEMERAL}]
    before, after = (text_form, block_form) if flip == "string" else (block_form, text_form)
    msg = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                        "content": before}]}
    again = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                          "content": after}]}
    assert Fingerprint([again, {"role": "user", "content": "x"}]).extends(
        Fingerprint([msg]).digest())
