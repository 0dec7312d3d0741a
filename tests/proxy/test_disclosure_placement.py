"""Disclosure on the wire: placements, history keep/drop, announced budgets, hidden untouched."""

from __future__ import annotations

import json
from typing import Any

import httpx
import orjson
import pytest
from conftest import Proxy, ProxyFactory, chat_body, new_id
from hypothesis import given
from hypothesis import strategies as st

from budgetproxy.proxy.calls import _without_large_floats
from budgetproxy.testing import FakeUpstream


def text(turn: int, total: int) -> str:
    left = max(0, total - turn)
    remain = "1 turn remains" if left == 1 else f"{left} turns remain"
    return f"[Turn budget] Turn {turn} of {total}. {remain} after this one."


def disclosed(proxy: ProxyFactory, **disclosure: Any) -> Proxy:
    return proxy({"disclosure": {"mode": "disclosed", **disclosure}})


def send(p: Proxy, eid: str, body: dict[str, Any] | bytes, **headers: str) -> httpx.Response:
    raw = body if isinstance(body, bytes) else orjson.dumps(body)
    r = p.http().post("/v1/chat/completions", content=raw,
                      headers={"content-type": "application/json", "X-Episode-Id": eid,
                               **headers})
    assert r.status_code == 200, r.text
    return r


def upstream_messages(up: FakeUpstream) -> list[Any]:
    msgs: list[Any] = up.requests[-1].json["messages"]
    return msgs


# -- placements -----------------------------------------------------------------------------


def test_last_message_string_content(proxy: ProxyFactory, upstream: FakeUpstream) -> None:
    p = disclosed(proxy)
    msgs = [{"role": "system", "content": "sys"}, {"role": "user", "content": "move left"}]
    send(p, new_id(), {"model": "m1", "messages": msgs, "temperature": 0},
         **{"X-Episode-Budget": "5"})
    seen = upstream.requests[-1].json
    assert seen["messages"] == [msgs[0], {"role": "user",
                                          "content": "move left\n\n" + text(1, 5)}]
    assert seen["temperature"] == 0 and seen["model"] == "m1"


def test_last_message_list_of_parts(proxy: ProxyFactory, upstream: FakeUpstream) -> None:
    p = disclosed(proxy)
    parts = [{"type": "text", "text": "look"},
             {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}]
    send(p, new_id(), {"model": "m1", "messages": [{"role": "user", "content": parts}]},
         **{"X-Episode-Budget": "4"})
    assert upstream_messages(upstream) == [
        {"role": "user", "content": [*parts, {"type": "text", "text": text(1, 4)}]}]


def test_last_message_tool_result(proxy: ProxyFactory, upstream: FakeUpstream) -> None:
    p = disclosed(proxy)
    msgs = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_0", "type": "function", "function": {"name": "move", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_0", "content": "moved to (1, 2)"},
    ]
    send(p, new_id(), {"model": "m1", "messages": msgs}, **{"X-Episode-Budget": "3"})
    assert upstream_messages(upstream) == [
        *msgs[:2],
        {"role": "tool", "tool_call_id": "call_0", "content": "moved to (1, 2)\n\n" + text(1, 3)},
    ]


def test_system_placement(proxy: ProxyFactory, upstream: FakeUpstream) -> None:
    p = disclosed(proxy, placement="system")
    eid = new_id()
    msgs = [{"role": "user", "content": "a"}]
    send(p, eid, {"model": "m1", "messages": msgs}, **{"X-Episode-Budget": "6"})
    assert upstream_messages(upstream) == [{"role": "system", "content": text(1, 6)}, *msgs]
    with_sys = [{"role": "system", "content": "You are an agent."},
                {"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                {"role": "system", "content": "second system"}, {"role": "user", "content": "c"}]
    send(p, eid, {"model": "m1", "messages": with_sys})
    seen = upstream_messages(upstream)
    assert seen[0] == {"role": "system", "content": "You are an agent.\n\n" + text(2, 6)}
    assert seen[1:] == with_sys[1:]
    assert sum(1 for m in seen if m["role"] == "system") == 2  # none added mid-way


def test_new_message_placement(proxy: ProxyFactory, upstream: FakeUpstream) -> None:
    p = disclosed(proxy, placement="new_message")
    msgs = [{"role": "user", "content": "a"}]
    send(p, new_id(), {"model": "m1", "messages": msgs}, **{"X-Episode-Budget": "2"})
    assert upstream_messages(upstream) == [*msgs, {"role": "user", "content": text(1, 2)}]


def test_streaming_calls_are_disclosed_too(proxy: ProxyFactory, upstream: FakeUpstream) -> None:
    p = disclosed(proxy)
    client = p.client(default_headers={"X-Episode-Id": new_id(), "X-Episode-Budget": "2"})
    out = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model="m1", messages=[{"role": "user", "content": "s"}], stream=True) if c.choices)
    assert upstream_messages(upstream) == [{"role": "user", "content": "s\n\n" + text(1, 2)}]
    assert out == "echo: s\n\n" + text(1, 2)


# -- history --------------------------------------------------------------------------------


def run_conversation(p: Proxy, up: FakeUpstream, eid: str, turns: int,
                     budget: int) -> list[list[Any]]:
    """An agent loop through the SDK: each turn resends the whole history plus a new message."""
    client = p.client(default_headers={"X-Episode-Id": eid, "X-Episode-Budget": str(budget)})
    history: list[Any] = [{"role": "system", "content": "You play FrozenLake."}]
    seen: list[list[Any]] = []
    for t in range(1, turns + 1):
        if t % 2:
            history.append({"role": "user", "content": f"observation {t}"})
        else:  # every other turn ends in a tool result
            history.append({"role": "assistant", "content": None, "tool_calls": [
                {"id": f"c{t}", "type": "function",
                 "function": {"name": "move", "arguments": '{"d": "L"}'}}]})
            history.append({"role": "tool", "tool_call_id": f"c{t}", "content": f"state {t}"})
        reply = client.chat.completions.create(model="m1", messages=history)
        seen.append(upstream_messages(up))
        assert reply.choices[0].message.content
        # (The fake echoes the prompt, disclosure text included; a model would not.)
        history.append({"role": "assistant", "content": f"reply {t}"})
    return seen


@pytest.mark.parametrize("placement", ["last_message", "new_message"])
def test_history_keep_is_append_only(
    proxy: ProxyFactory, upstream: FakeUpstream, placement: str
) -> None:
    p = disclosed(proxy, placement=placement, history="keep")
    seen = run_conversation(p, upstream, new_id(), turns=5, budget=8)
    for earlier, later in zip(seen, seen[1:], strict=False):
        assert later[: len(earlier)] == earlier
    final = orjson.dumps(seen[-1]).decode()
    for t in range(1, 6):  # every turn's text is still where it was, with its own numbers
        assert final.count(orjson.dumps(text(t, 8)).decode()[1:-1]) == 1


def test_history_drop_sends_only_the_current_text(
    proxy: ProxyFactory, upstream: FakeUpstream
) -> None:
    p = disclosed(proxy, history="drop")
    seen = run_conversation(p, upstream, new_id(), turns=3, budget=8)
    last = orjson.dumps(seen[-1]).decode()
    assert "Turn 3 of 8" in last
    assert "Turn 1 of 8" not in last and "Turn 2 of 8" not in last
    assert seen[-1][-1]["content"].endswith("\n\n" + text(3, 8))


def test_history_keep_after_a_shrunk_history_drops_the_earlier_texts(
    proxy: ProxyFactory, upstream: FakeUpstream
) -> None:
    """A client that summarised its history gets no earlier text on whatever message now has
    that index; tracking starts again from the new conversation."""
    p = disclosed(proxy, history="keep")
    eid = new_id()
    sys_ = {"role": "system", "content": "sys"}
    long = [sys_, {"role": "user", "content": "u1"}, {"role": "assistant", "content": "a1"},
            {"role": "user", "content": "u2"}]
    send(p, eid, {"model": "m1", "messages": long[:2]}, **{"X-Episode-Budget": "6"})
    send(p, eid, {"model": "m1", "messages": long})
    assert upstream_messages(upstream)[1]["content"] == "u1\n\n" + text(1, 6)
    summary = [sys_, {"role": "user", "content": "summary of u1, u2"},
               {"role": "assistant", "content": "ok"}, {"role": "user", "content": "u3"}]
    send(p, eid, {"model": "m1", "messages": summary})
    third = upstream_messages(upstream)
    assert third == [*summary[:3], {"role": "user", "content": "u3\n\n" + text(3, 6)}]
    grown = [*summary, {"role": "assistant", "content": "a3"}, {"role": "user", "content": "u4"}]
    send(p, eid, {"model": "m1", "messages": grown})
    fourth = upstream_messages(upstream)
    assert fourth[: len(third)] == third  # append-only again from the rewrite on
    assert fourth[len(third):] == [grown[4], {"role": "user", "content": "u4\n\n" + text(4, 6)}]


def test_history_keep_after_an_edited_message_drops_the_earlier_texts(
    proxy: ProxyFactory, upstream: FakeUpstream
) -> None:
    p = disclosed(proxy, history="keep", placement="new_message")
    eid = new_id()
    send(p, eid, {"model": "m1", "messages": [{"role": "user", "content": "task"}]},
         **{"X-Episode-Budget": "5"})
    edited = [{"role": "user", "content": "task, edited"},
              {"role": "assistant", "content": "a1"}, {"role": "user", "content": "u2"}]
    send(p, eid, {"model": "m1", "messages": edited})
    assert upstream_messages(upstream) == [*edited, {"role": "user", "content": text(2, 5)}]


def test_new_message_texts_never_part_tool_calls_from_their_replies(
    proxy: ProxyFactory, upstream: FakeUpstream
) -> None:
    """A turn sent with only some of an assistant's tool replies: its text goes back after
    all of them on the next turn (OpenAI refuses a user message in between)."""
    p = disclosed(proxy, history="keep", placement="new_message")
    eid = new_id()
    calls = {"role": "assistant", "content": None, "tool_calls": [
        {"id": f"c{i}", "type": "function", "function": {"name": "look", "arguments": "{}"}}
        for i in (1, 2)]}
    first = [{"role": "user", "content": "go"}, calls,
             {"role": "tool", "tool_call_id": "c1", "content": "r1"}]
    send(p, eid, {"model": "m1", "messages": first}, **{"X-Episode-Budget": "5"})
    assert upstream_messages(upstream) == [*first, {"role": "user", "content": text(1, 5)}]
    second = [*first, {"role": "tool", "tool_call_id": "c2", "content": "r2"}]
    send(p, eid, {"model": "m1", "messages": second})
    assert upstream_messages(upstream) == [
        *second, {"role": "user", "content": text(1, 5)}, {"role": "user", "content": text(2, 5)}]


def test_free_retry_keeps_its_turn_text(proxy: ProxyFactory, upstream: FakeUpstream) -> None:
    p = disclosed(proxy)
    eid = new_id()
    body = orjson.dumps(chat_body("same"))
    send(p, eid, body, **{"X-Episode-Budget": "4"})
    first = upstream.requests[-1].body
    send(p, eid, body)
    assert upstream.requests[-1].body == first


# -- texts ----------------------------------------------------------------------------------


def test_announced_budget_changes_total_and_remaining(
    proxy: ProxyFactory, upstream: FakeUpstream
) -> None:
    p = disclosed(proxy)
    eid = new_id()
    r = send(p, eid, chat_body("a"),
             **{"X-Episode-Budget": "3", "X-Episode-Announced-Budget": "10"})
    assert upstream_messages(upstream)[-1]["content"] == "a\n\n" + text(1, 10)
    assert r.headers["x-episode-budget"] == "3"  # the enforced budget is unchanged
    send(p, eid, chat_body("b"))
    send(p, eid, chat_body("c"))
    assert upstream_messages(upstream)[-1]["content"] == "c\n\n" + text(3, 10)
    assert p.http().post("/v1/chat/completions", json=chat_body("d"),
                         headers={"X-Episode-Id": eid}).status_code == 403


def test_custom_template_fields_and_remaining_never_negative(
    proxy: ProxyFactory, upstream: FakeUpstream
) -> None:
    p = disclosed(proxy, template="used={used} turn={turn} total={total} left={remaining}")
    eid = new_id()
    send(p, eid, chat_body("a"), **{"X-Episode-Budget": "4", "X-Episode-Announced-Budget": "2"})
    assert upstream_messages(upstream)[-1]["content"] == "a\n\nused=0 turn=1 total=2 left=1"
    for t in ("b", "c"):
        send(p, eid, chat_body(t))
    assert upstream_messages(upstream)[-1]["content"] == "c\n\nused=2 turn=3 total=2 left=0"


def test_disclosure_is_logged(proxy: ProxyFactory) -> None:
    p = disclosed(proxy)
    eid = new_id()
    send(p, eid, chat_body("a"), **{"X-Episode-Budget": "2"})
    rec = p.wait_records(type="turn", episode_id=eid)
    assert rec[0]["disclosure"] == {"arm": "disclosed", "text": text(1, 2)}
    # The log keeps the client's own messages, not the rewritten ones.
    assert rec[0]["request_messages"] == [{"role": "user", "content": "a"}]


# -- what disclosure must not touch -----------------------------------------------------------


def test_client_response_is_unchanged_by_disclosure(proxy: ProxyFactory) -> None:
    p = disclosed(proxy)
    tools = [{"type": "function", "function": {"name": "move", "parameters": {
        "type": "object", "properties": {"d": {"type": "string"}}}}}]
    replies = {}
    for arm in ("hidden", "disclosed"):
        r = send(p, new_id(), chat_body("go", tools=tools),
                 **{"X-Episode-Disclosure": arm, "X-Fake-Parallel-Tools": "2"})
        body = r.json()
        for volatile in ("id", "created", "usage"):  # prompt tokens grew, nothing else
            body.pop(volatile)
        replies[arm] = (body, sorted(k for k in r.headers if not k.startswith("x-episode")
                                     and k not in ("date",)))
    assert replies["hidden"] == replies["disclosed"]


def test_echoed_reply_reaches_the_client_verbatim(
    proxy: ProxyFactory, upstream: FakeUpstream
) -> None:
    p = disclosed(proxy)
    r = send(p, new_id(), chat_body("echo me"), **{"X-Fake-Echo-Request": "1"})
    assert orjson.loads(r.json()["choices"][0]["message"]["content"]) == upstream_messages(upstream)


def test_hidden_arm_forwards_body_bytes_untouched(
    proxy: ProxyFactory, upstream: FakeUpstream
) -> None:
    p = disclosed(proxy)
    eid = new_id()
    raw = b'{"model":"m1",  "messages":[{"role":"user","content":"h\\u00e9"}],"top_p":1}'
    for _ in range(2):
        send(p, eid, raw + b" ", **{"X-Episode-Disclosure": "hidden"})
        assert upstream.requests[-1].body == raw + b" "
        raw = raw.replace(b'"top_p":1', b'"top_p":0.5')


BIG = 123456789012345678901234567890  # past 64 bits: orjson reads it as a float


@pytest.mark.parametrize("arm", ["disclosed", "hidden"])
def test_a_rewritten_body_keeps_integers_past_64_bits_exact(
    proxy: ProxyFactory, upstream: FakeUpstream, arm: str
) -> None:
    """The disclosed arm re-encodes the body, and so does a hidden streaming call that gets
    include_usage added: values the proxy does not touch reach the upstream as sent."""
    p = disclosed(proxy)
    tools = [{"type": "function", "function": {"name": "pick", "parameters": {
        "type": "object", "properties": {"n": {"type": "integer", "default": -(2**64) - 1,
                                              "maximum": 2**64, "minimum": -(2**63)}}}}}]
    body = {"model": "m1", "seed": BIG, "temperature": 0.25, "tools": tools, "stream": True,
            "messages": [{"role": "user", "content": "pick", "name": "u", "x": [2**100, 1.5]}]}
    raw = json.dumps(body).encode()
    r = send(p, new_id(), raw, **{"X-Episode-Disclosure": arm})
    assert r.text.startswith("data:")
    seen = json.loads(upstream.requests[-1].body)  # the standard parser keeps big integers
    assert seen["stream_options"] == {"include_usage": True}
    assert seen["seed"] == BIG and isinstance(seen["seed"], int)
    assert seen["tools"] == tools and seen["temperature"] == 0.25
    assert seen["messages"][0]["x"] == [2**100, 1.5]
    if arm == "disclosed":
        assert seen["messages"][0]["content"] == "pick\n\n" + text(1, 20)
    else:
        assert seen["messages"] == body["messages"]


def test_integers_past_64_bits_stay_exact_as_a_long_episode_grows(
    proxy: ProxyFactory, upstream: FakeUpstream
) -> None:
    """A turn checks only what it adds when the previous turn's conversation starts its own
    and held no such integer (core/prefixes.py): one that arrives in a new message, and the
    turns after it, still reach the upstream exact."""
    p = disclosed(proxy, history="keep")
    eid = new_id()
    history: list[dict[str, Any]] = [{"role": "user", "content": "u1"}]
    for t in range(1, 6):
        if t == 3:  # a new message with integers orjson reads as floats
            history[-1] = {**history[-1], "x": [2**100 + 1, -(2**64) - 1]}
        raw = json.dumps({"model": "m1", "messages": history, "seed": 7}).encode()
        send(p, eid, raw, **({"X-Episode-Budget": "9"} if t == 1 else {}))
        seen = json.loads(upstream.requests[-1].body)
        assert seen["seed"] == 7
        if t >= 3:
            assert [m["x"] for m in seen["messages"] if "x" in m] == [[2**100 + 1, -(2**64) - 1]]
        assert seen["messages"][-1]["content"].endswith(text(t, 9)), t
        history += [{"role": "assistant", "content": f"a{t}"},
                    {"role": "user", "content": f"u{t + 1}"}]


@given(st.one_of(
    st.floats(min_value=1e16, allow_infinity=False),
    st.floats(max_value=-1e16, allow_infinity=False),
    st.integers(min_value=2**64).map(str), st.integers(max_value=-(2**63) - 1).map(str),
))
def test_what_orjson_reads_past_64_bits_it_writes_with_an_exponent(value: float | str) -> None:
    """The check that lets a turn's new messages skip the walk for such integers
    (calls.py `_without_large_floats`) rests on orjson: every float of 1e16 or more, which is
    what it reads an integer past 64 bits as, is written with "e+"."""
    parsed = orjson.loads(f'[{{"x": {value}}}]') if isinstance(value, str) else [{"x": value}]
    written = orjson.dumps(parsed)
    assert b"e+" in written
    assert not _without_large_floats(written, 0)
    assert _without_large_floats(orjson.dumps([{"x": 2**63 - 1, "y": 9.9e15, "z": -(2**63)}]), 0)


def test_a_long_episodes_bodies_are_written_from_the_previous_turns(
    proxy: ProxyFactory, upstream: FakeUpstream, spliced_bodies: list[bool]
) -> None:
    """A long conversation's disclosed turn copies the previous body's messages from its
    second turn on (proxy/spliced.py): each body the upstream gets is still orjson's writing
    of what it holds, every earlier message's bytes as they were sent, the texts in place,
    also when the call's other members change, and when a stream's usage is asked for. A
    short one is written whole."""
    made = spliced_bodies
    p = disclosed(proxy, history="keep")
    eid = new_id()
    history: list[dict[str, Any]] = [{"role": "system", "content": "sys \u00e9" * 8000},
                                     {"role": "user", "content": "u1"}]
    sent: list[bytes] = []
    for t in range(1, 9):
        body: dict[str, Any] = {"messages": history, "model": "m1"}
        if t >= 4:
            body["temperature"] = 0.5 + t  # another member, after the messages
        if t in (5, 6):
            body["stream"] = True
        raw = orjson.dumps(body)
        r = p.http().post("/v1/chat/completions", content=raw, headers={
            "content-type": "application/json", "X-Episode-Id": eid,
            **({"X-Episode-Budget": "20"} if t == 1 else {})})
        assert r.status_code == 200, r.text
        got = upstream.requests[-1].body
        assert got == orjson.dumps(orjson.loads(got)), t
        if sent:  # append-only: the previous prompt's messages' bytes, then the new ones
            before = orjson.dumps(orjson.loads(sent[-1])["messages"])[:-1]
            assert orjson.dumps(orjson.loads(got)["messages"]).startswith(before + b","), t
        assert orjson.loads(got)["messages"][-1]["content"].startswith(f"u{t}\n\n"), t
        sent.append(got)
        history = [*history, {"role": "assistant", "content": f"a{t}"},
                   {"role": "user", "content": f"u{t + 1}"}]
    assert made[1:] and all(made[1:]), made  # (the first turn has no previous body)
    made.clear()
    short = new_id()
    for t in range(1, 4):
        send(p, short, {"model": "m1", "messages": [{"role": "user", "content": f"u{k}"}
                                                    for k in range(1, 2 * t)]},
             **({"X-Episode-Budget": "20"} if t == 1 else {}))
    assert made == []  # (a short conversation's body is written whole: cheaper)


def test_a_message_too_deep_to_rewrite_is_refused_in_a_long_conversation_too(
    proxy: ProxyFactory, upstream: FakeUpstream
) -> None:
    """A message nested as deep as orjson writes the messages alone, but not the body they sit
    in: the call is refused (400, nothing forwarded) whether the conversation is short or long
    enough for its body to be written from the previous turn's (proxy/spliced.py)."""
    deep: Any = []
    for _ in range(251):
        deep = [deep]
    p = disclosed(proxy, history="keep")
    for size in (10, 40000):
        eid = new_id()
        history: list[Any] = [{"role": "system", "content": "s" * size},
                              {"role": "user", "content": "u1"}]
        send(p, eid, {"model": "m1", "messages": history}, **{"X-Episode-Budget": "5"})
        history += [{"role": "assistant", "content": "a1"},
                    {"role": "user", "content": "u2", "x": deep}]
        before = len(upstream.requests)
        r = p.http().post("/v1/chat/completions", content=json.dumps(
            {"model": "m1", "messages": history}).encode(),
            headers={"content-type": "application/json", "X-Episode-Id": eid})
        assert (r.status_code, len(upstream.requests) - before) == (400, 0), size
        assert "too deeply" in r.json()["error"]["message"]


def test_an_integer_past_64_bits_changed_in_the_history_reaches_the_upstream(
    proxy: ProxyFactory, upstream: FakeUpstream
) -> None:
    """2**70 + 1 and 2**70 + 2 read as the same float: a turn whose history changed one into
    the other is not taken from the previous turn's placed messages."""
    p = disclosed(proxy, history="keep")
    eid = new_id()
    for t, value in enumerate([2**70 + 1, 2**70 + 2, 2**70 + 3], 1):
        history = [{"role": "user", "content": "u1", "x": value}]
        for k in range(2, t + 1):
            history += [{"role": "assistant", "content": f"a{k}"},
                        {"role": "user", "content": f"u{k}"}]
        send(p, eid, json.dumps({"model": "m1", "messages": history}).encode(),
             **({"X-Episode-Budget": "9"} if t == 1 else {}))
        assert json.loads(upstream.requests[-1].body)["messages"][0]["x"] == value, t


def test_non_chat_calls_are_forwarded_as_is(proxy: ProxyFactory, upstream: FakeUpstream) -> None:
    p = disclosed(proxy)
    raw = b'{"model": "m1", "prompt": "complete me"}'
    r = p.http().post("/v1/completions", content=raw,
                      headers={"content-type": "application/json", "X-Episode-Id": new_id()})
    assert r.status_code == 200
    assert upstream.requests[-1].body == raw
