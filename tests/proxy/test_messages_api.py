"""/v1/messages end to end: the official anthropic client through the real proxy to the fake
upstream; the upstream key, disclosure, cache markers, finish and reject, errors, records."""

from __future__ import annotations

from typing import Any

import anthropic
import httpx
import pytest

from budgetproxy.config import FinishTexts
from budgetproxy.testing import FakeUpstream
from tests.conftest import Proxy, ProxyFactory, new_id

EXHAUSTED_TEXT = FinishTexts().turns

TEMPLATE = "[Turn budget] Turn {turn} of {total}."
TOOLS = [{"name": "look", "description": "look around",
          "input_schema": {"type": "object", "properties": {"where": {"type": "string"}}}}]
EPHEMERAL = {"type": "ephemeral"}


def keyed(proxy: ProxyFactory, upstream: FakeUpstream, **over: Any) -> Proxy:
    up = {"name": "anthropic", "base_url": upstream.base_url, "api_key": "sk-upstream-key"}
    return proxy({"upstreams": [up], **over})


def client(p: Proxy, eid: str, **headers: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=p.url, api_key="sk-client-key", max_retries=0,
                               timeout=20.0, default_headers={
                                   "X-Episode-Id": eid, "X-Test-Episode": eid, **headers})


def last_request(upstream: FakeUpstream, eid: str) -> Any:
    mine = [r for r in upstream.requests if r.path == "/v1/messages"
            and r.headers.get("x-test-episode") == eid]
    assert mine, "the upstream saw no call of this episode"
    return mine[-1]


def assert_anthropic_error(r: httpx.Response, status: int, kind: str) -> None:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
    assert body["error"]["type"] == kind
    if status < 500:
        assert r.headers["x-should-retry"] == "false"


@pytest.mark.parametrize("stream", [False, True])
def test_upstream_key_in_x_api_key_versions_pass_through_and_the_turn_is_recorded(
        proxy: ProxyFactory, upstream: FakeUpstream, stream: bool) -> None:
    p = keyed(proxy, upstream)
    eid = new_id()
    c = client(p, eid, **{"anthropic-beta": "tools-2024-04-04"})
    args: dict[str, Any] = {"model": "m1", "max_tokens": 64, "tools": TOOLS,
                            "system": "be brief",
                            "messages": [{"role": "user", "content": "find it"}]}
    if stream:
        with c.messages.stream(**args, extra_headers={"X-Fake-Cache-Read": "11"}) as s:
            msg = s.get_final_message()
    else:
        msg = c.messages.create(**args, extra_headers={"X-Fake-Cache-Read": "11"})
    assert msg.stop_reason == "tool_use" and msg.content[0].type == "tool_use"
    seen = last_request(upstream, eid)
    assert seen.headers["x-api-key"] == "sk-upstream-key"
    assert "authorization" not in seen.headers
    assert seen.headers["anthropic-version"] and seen.headers["anthropic-beta"] == (
        "tools-2024-04-04")
    (rec,) = p.wait_records(1, type="turn", episode_id=eid)
    assert rec["system"] == "be brief"
    assert rec["request_messages"] == args["messages"]
    assert rec["finish_reason"] == "tool_use"
    assert rec["response"]["tool_calls"][0]["function"]["name"] == "look"
    assert rec["response"]["content_blocks"][0]["input"] == {"where": "fake"}
    assert rec["usage"]["input_tokens"] > 0 and rec["usage"]["cache_read_input_tokens"] == 11
    assert rec["usage"]["output_tokens"] == msg.usage.output_tokens


def test_streamed_text_is_recorded(default_proxy: Proxy) -> None:
    eid = new_id()
    with client(default_proxy, eid).messages.stream(
            model="m1", max_tokens=64, messages=[{"role": "user", "content": "hi there"}]) as s:
        text = "".join(s.text_stream)
    assert text == "echo: hi there"
    (rec,) = default_proxy.wait_records(1, type="turn", episode_id=eid)
    assert (rec["response"]["content"], rec["finish_reason"]) == (text, "end_turn")


def test_disclosure_after_tool_results_and_moving_cache_markers_keep_the_history(
        proxy: ProxyFactory, upstream: FakeUpstream) -> None:
    """Claude Code moves cache_control to the newest message each turn: still append-only,
    so turn 1's text stays where it was and the log holds only what is new."""
    p = proxy({"disclosure": {"mode": "disclosed", "template": TEMPLATE}})
    eid = new_id()
    c = client(p, eid, **{"X-Episode-Budget": "5"})
    first: list[Any] = [{"role": "user", "content": [
        {"type": "text", "text": "find it", "cache_control": EPHEMERAL}]}]
    msg = c.messages.create(model="m1", max_tokens=64, tools=TOOLS, messages=first)
    second = [{"role": "user", "content": [{"type": "text", "text": "find it"}]},
              {"role": "assistant", "content": [b.model_dump() for b in msg.content]},
              {"role": "user", "content": [{"type": "tool_result", "tool_use_id": msg.content[0].id,
                                            "content": "a key", "cache_control": EPHEMERAL}]},
              {"role": "system", "content": "a note inside messages"}]
    c.messages.create(model="m1", max_tokens=64, tools=TOOLS, messages=second)
    sent = last_request(upstream, eid).json["messages"]
    assert sent[0]["content"][-1] == {"type": "text", "text": "[Turn budget] Turn 1 of 5."}
    assert sent[2]["content"][0]["type"] == "tool_result"
    assert sent[2]["content"][0]["cache_control"] == EPHEMERAL  # forwarded as sent
    assert sent[2]["content"][-1] == {"type": "text", "text": "[Turn budget] Turn 2 of 5."}
    assert sent[3] == second[3]
    recs = p.wait_records(2, type="turn", episode_id=eid)
    assert recs[1]["messages_offset"] == 1 and len(recs[1]["request_messages"]) == 3
    assert "cache_control" not in str(recs[1]["request_messages"])


@pytest.mark.parametrize(("placement", "system", "check"), [
    ("system", [{"type": "text", "text": "sys"}],
     lambda b: b["system"][-1] == {"type": "text", "text": "[Turn budget] Turn 1 of 2."}),
    ("new_message", None,
     lambda b: len(b["messages"]) == 1 and b["messages"][0]["content"][-1]["text"] == (
         "[Turn budget] Turn 1 of 2.")),
])
def test_system_and_new_message_placements(
        proxy: ProxyFactory, upstream: FakeUpstream, placement: str, system: Any,
        check: Any) -> None:
    p = proxy({"disclosure": {"mode": "disclosed", "template": TEMPLATE,
                              "placement": placement}})
    eid = new_id()
    extra = {"system": system} if system is not None else {}
    client(p, eid, **{"X-Episode-Budget": "2"}).messages.create(
        model="m1", max_tokens=8, messages=[{"role": "user", "content": "x"}], **extra)
    assert check(last_request(upstream, eid).json)


@pytest.fixture(scope="module")
def finishing(proxy: ProxyFactory) -> Proxy:
    return proxy({"budget": {"on_exhausted": "finish"}})


def spend(p: Proxy, eid: str) -> None:
    client(p, eid, **{"X-Episode-Budget": "1"}).messages.create(
        model="m1", max_tokens=8, messages=[{"role": "user", "content": "only turn"}])


def test_finish_mode_answers_a_final_message(finishing: Proxy) -> None:
    eid = new_id()
    spend(finishing, eid)
    raw = client(finishing, eid).messages.with_raw_response.create(
        model="m1", max_tokens=8, tools=TOOLS, messages=[{"role": "user", "content": "again"}])
    assert raw.headers["x-episode-exhausted"] == "true"
    msg = raw.parse()
    assert (msg.type, msg.role, msg.stop_reason) == ("message", "assistant", "end_turn")
    assert [b.type for b in msg.content] == ["text"] and msg.content[0].text == EXHAUSTED_TEXT


def test_finish_mode_streams_a_normal_end_of_turn(finishing: Proxy) -> None:
    eid = new_id()
    spend(finishing, eid)
    with client(finishing, eid).messages.stream(
            model="m1", max_tokens=8, messages=[{"role": "user", "content": "again"}]) as s:
        kinds = [e.type for e in s]
        msg = s.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "content_block_stop" in kinds and "message_delta" in kinds
    assert msg.content[0].text == EXHAUSTED_TEXT and msg.stop_reason == "end_turn"


def test_reject_mode_and_the_proxys_own_errors_are_anthropic_shaped(
        default_proxy: Proxy) -> None:
    eid = new_id()
    spend(default_proxy, eid)
    with pytest.raises(anthropic.PermissionDeniedError) as exc:
        client(default_proxy, eid).messages.create(
            model="m1", max_tokens=8, messages=[{"role": "user", "content": "again"}])
    assert "turn budget" in str(exc.value)
    http = default_proxy.http()
    r = http.post("/v1/messages", json={"model": "m1", "messages": [
        {"role": "user", "content": "x"}]}, headers={"X-Episode-Id": eid})
    assert_anthropic_error(r, 403, "permission_error")
    assert_anthropic_error(http.post("/v1/messages", content=b"{nope"), 400,
                           "invalid_request_error")
    assert_anthropic_error(http.post("/v1/messages", json={"model": "m1", "messages": []}), 400,
                           "invalid_request_error")
    for path in ("/episodes/bad id/v1/messages", "/episodes/bad id/v1/messages/count_tokens"):
        assert_anthropic_error(http.post(path, json={}), 400, "invalid_request_error")


def test_auth_errors_and_size_limits_on_messages_routes(proxy: ProxyFactory) -> None:
    p = proxy({"auth": {"keys": ["proxy-key"]}, "server": {"max_body_bytes": 2000}})
    http = p.http()
    body = {"model": "m1", "max_tokens": 8, "messages": [{"role": "user", "content": "x"}]}
    assert_anthropic_error(http.post("/v1/messages", json=body), 401, "authentication_error")
    assert_anthropic_error(http.post("/v1/messages/count_tokens", json=body), 401,
                           "authentication_error")
    # The Anthropic client's own header carries the proxy's key.
    ok = anthropic.Anthropic(base_url=p.url, api_key="proxy-key", max_retries=0).messages.create(
        **body)
    assert ok.content[0].text == "echo: x"
    big = {**body, "messages": [{"role": "user", "content": "x" * 3000}]}
    assert_anthropic_error(http.post("/v1/messages", json=big, headers={"x-api-key": "proxy-key"}),
                           413, "request_too_large")


def test_count_tokens_passes_through_with_the_upstream_key_uncounted(
        proxy: ProxyFactory, upstream: FakeUpstream) -> None:
    p = keyed(proxy, upstream)
    eid = new_id()
    n = client(p, eid).messages.count_tokens(
        model="m1", messages=[{"role": "user", "content": "three words here"}])
    assert n.input_tokens == 3
    seen = [r for r in upstream.requests if r.path == "/v1/messages/count_tokens"][-1]
    assert seen.headers["x-api-key"] == "sk-upstream-key"
    assert p.http().get(f"/v1/episodes/{eid}").status_code == 404  # no turn, no episode


@pytest.mark.parametrize(("path", "body", "last"), [
    ("/v1/messages", {"model": "m1", "max_tokens": 8, "stream": True,
                      "messages": [{"role": "user", "content": "bye"}]}, b"message_stop"),
    ("/v1/responses", {"model": "m1", "stream": True, "input": "bye"}, b"response.completed"),
])
def test_a_client_that_hangs_up_after_the_last_event_got_its_whole_answer(
        default_proxy: Proxy, path: str, body: dict[str, Any], last: bytes) -> None:
    eid = new_id()
    headers = {"X-Episode-Id": eid, "X-Fake-Tail-Ms": "1500"}  # the upstream closes late
    with httpx.Client(base_url=default_proxy.url, timeout=10) as http, http.stream(
            "POST", path, json=body, headers=headers) as r:
        seen = b""
        for chunk in r.iter_bytes():
            seen += chunk
            if last in seen:
                break
    (rec,) = default_proxy.wait_records(1, type="turn", episode_id=eid)
    assert rec["status"] == "ok" and rec["response"]["content"] == "echo: bye"


@pytest.mark.parametrize("api,where", [("messages", "new"), ("messages", "marker"),
                                       ("messages", "tools"), ("responses", "new")])
def test_integers_past_64_bits_stay_exact_in_a_long_session(
    proxy: ProxyFactory, upstream: FakeUpstream, api: str, where: str
) -> None:
    """A turn walks only what its previous turn did not check (core/prefixes.py): an item
    that is the conversation's own entry, checked last turn, is skipped; one whose markers the
    conversation leaves out (a marked message) is walked. An integer past 64 bits arriving in
    a new message, or in the marker of an old one, or in the tools (which the same bytes as
    the previous turn's let the check pass over), after clean turns reaches the upstream
    exact, on that turn and the ones after it."""
    import json

    p = proxy({"disclosure": {"mode": "disclosed", "template": TEMPLATE, "history": "keep"}})
    eid = new_id()
    big = 123456789012345678901234567891  # (no float equals it)
    history: list[dict[str, Any]] = [{"role": "user", "content": [
        {"type": "text", "text": "u1", "cache_control": EPHEMERAL}]}]
    path = "/v1/messages" if api == "messages" else "/v1/responses"
    for t in range(1, 6):
        if t == 3 and where == "new":  # a new message with an integer orjson reads as a float
            history[-1] = {**history[-1], "n": big}
        if t == 3 and where == "marker":  # the first prompt's marker, on an old message
            history[0] = {"role": "user", "content": [
                {"type": "text", "text": "u1", "cache_control": {"type": "ephemeral", "n": big}}]}
        default = big if t >= 3 and where == "tools" else 1
        tools = [{"name": "Tool", "input_schema": {"type": "object", "properties": {
            "n": {"type": "integer", "default": default}}}}]
        if api == "messages":  # the newest message marked, as Claude Code does
            newest = {**history[-1], "content": [
                {**history[-1]["content"][0], "cache_control": EPHEMERAL}]}
            body = {"model": "m1", "max_tokens": 16, "system": "sys", "tools": tools,
                    "messages": [*history[:-1], newest] if t > 1 else history}
        else:
            body = {"model": "m1", "instructions": "sys", "input": history}
        r = httpx.post(f"{p.url}{path}", content=json.dumps(body).encode(),
                       headers={"content-type": "application/json", "X-Episode-Id": eid,
                                "X-Test-Episode": eid, "X-Episode-Budget": "9"}, timeout=20)
        assert r.status_code == 200, r.text
        seen = [json.loads(q.body) for q in upstream.requests
                if q.headers.get("x-test-episode") == eid][-1]
        items = seen["messages"] if api == "messages" else seen["input"]
        if where == "tools":
            found = [seen["tools"][0]["input_schema"]["properties"]["n"]["default"]]
            assert found == [big if t >= 3 else 1], (t, found)
        else:
            found = ([m["n"] for m in items if "n" in m] if where == "new"
                     else [b["cache_control"].get("n") for b in items[0]["content"]
                           if "cache_control" in b])
            assert found == ([big] if t >= 3 else [] if where == "new" else [None]), (t, found)
        history += [{"role": "assistant", "content": [{"type": "text", "text": f"a{t}"}]},
                    {"role": "user", "content": [{"type": "text", "text": f"u{t + 1}"}]}]


def test_tools_another_episode_checked_let_only_their_own_bytes_pass(
    proxy: ProxyFactory, upstream: FakeUpstream
) -> None:
    """The tools one episode's check found clean are not looked at again in another episode
    (core/prefixes.py `CheckedOthers`), but only when their bytes are the same: tools of the
    same length as orjson writes them, with an integer past 64 bits, are checked and sent
    exact; and the same tools do not stand for the messages beside them."""
    import json

    p = proxy({"disclosure": {"mode": "disclosed", "template": TEMPLATE, "history": "keep"}})
    big = 123456789012345678901234567891  # orjson writes 1.2345678901234568e29
    clean = 1.2345678901234568e18  # orjson writes 1.2345678901234568e18: the same length

    def first_turn(default: Any, message: dict[str, Any]) -> dict[str, Any]:
        eid = new_id()
        tools = [{"name": "Tool", "input_schema": {"type": "object", "properties": {
            "n": {"type": "integer", "default": default}}}}]
        body = {"model": "m1", "max_tokens": 16, "system": "sys", "tools": tools,
                "messages": [{"role": "user", "content": "u1", **message}]}
        r = httpx.post(f"{p.url}/v1/messages", content=json.dumps(body).encode(),
                       headers={"content-type": "application/json", "X-Episode-Id": eid,
                                "X-Test-Episode": eid}, timeout=20)
        assert r.status_code == 200, r.text
        seen: dict[str, Any] = json.loads(next(
            q.body for q in upstream.requests if q.headers.get("x-test-episode") == eid))
        return seen

    for _ in range(2):  # (the second time, the clean tools are known)
        seen = first_turn(clean, {})
        assert seen["tools"][0]["input_schema"]["properties"]["n"]["default"] == clean
    seen = first_turn(big, {})
    assert seen["tools"][0]["input_schema"]["properties"]["n"]["default"] == big
    seen = first_turn(clean, {"n": big})
    assert seen["messages"][0]["n"] == big


@pytest.mark.parametrize("where", ["tools", "message"])
def test_a_turn_whose_integers_could_not_be_read_again_stands_for_no_later_check(
    proxy: ProxyFactory, upstream: FakeUpstream, where: str
) -> None:
    """A body with an integer past 64 bits that the standard library cannot read again (a
    marker nested past its depth) is refused; the next turn, whose bytes start as that one's
    did, still finds the integer and sends it exact (the refused turn checked nothing)."""
    import json

    p = proxy({"disclosure": {"mode": "disclosed", "template": TEMPLATE}})
    eid = new_id()
    big = 2**64 + 1  # (no float equals it)
    deep = "[" * 1010 + "]" * 1010  # (orjson reads it; the standard library's parser does not)
    tools = [{"name": "look", "description": "d", "input_schema": {
        "type": "object", **({"maximum": big} if where == "tools" else {})}}]
    first: dict[str, Any] = {"role": "user", "content": [
        {"type": "text", "text": "u0", "cache_control": {"type": "ephemeral", "x": "DEEP"}}]}
    if where == "message":
        first["n"] = big
    turns = [[first], [{**first, "content": [{"type": "text", "text": "u0"}]},
                       {"role": "assistant", "content": "a1"},
                       {"role": "user", "content": [{"type": "text", "text": "u1",
                                                     "cache_control": EPHEMERAL}]}]]
    for t, messages in enumerate(turns, 1):
        body = json.dumps({"model": "m1", "max_tokens": 64, "tools": tools,
                           "messages": messages}).replace('"DEEP"', deep).encode()
        r = httpx.post(f"{p.url}/v1/messages", content=body, timeout=20,
                       headers={"content-type": "application/json", "X-Episode-Id": eid,
                                "X-Test-Episode": eid, "X-Episode-Budget": "9"})
        assert r.status_code == (400 if t == 1 else 200), r.text
    seen = json.loads([q.body for q in upstream.requests
                       if q.headers.get("x-test-episode") == eid][-1])
    if where == "tools":
        assert seen["tools"][0]["input_schema"]["maximum"] == big
    else:
        assert seen["messages"][0]["n"] == big


def test_a_long_sessions_bodies_are_written_from_the_previous_turns(
    proxy: ProxyFactory, upstream: FakeUpstream, spliced_bodies: list[bool]
) -> None:
    """Claude Code's shape, a long conversation: the newest message marked every turn, a tool
    call and its result each turn. From the second turn on, the body copies the previous
    body's items but the one whose marker moved (proxy/spliced.py); each body the upstream
    gets is orjson's writing of what it holds, the earlier items' bytes as they were."""
    import orjson

    made = spliced_bodies
    p = proxy({"disclosure": {"mode": "disclosed", "template": TEMPLATE, "history": "keep"}})
    eid = new_id()
    history: list[dict[str, Any]] = [{"role": "user", "content": "start " * 6000}]
    sent: list[Any] = []
    for t in range(1, 7):
        wire = list(history)
        if t > 1:  # the first prompt as a marked block, and the newest message marked
            wire[0] = {"role": "user", "content": [
                {"type": "text", "text": history[0]["content"], "cache_control": EPHEMERAL}]}
            wire[-1] = {"role": "user", "content": [
                {**history[-1]["content"][0], "cache_control": EPHEMERAL}]}
        body = {"model": "m1", "max_tokens": 64, "system": "sys", "tools": TOOLS,
                "messages": wire}
        r = httpx.post(f"{p.url}/v1/messages", content=orjson.dumps(body), timeout=20,
                       headers={"content-type": "application/json", "X-Episode-Id": eid,
                                "X-Test-Episode": eid, "X-Episode-Budget": "9"})
        assert r.status_code == 200, r.text
        got = last_request(upstream, eid).body
        assert got == orjson.dumps(orjson.loads(got)), t
        items = orjson.loads(got)["messages"]
        if sent:  # every earlier item as it was sent, but the one whose marker moved
            assert items[:len(sent) - 1] == sent[:-1], t
        assert items[-1]["content"][-1]["text"] == f"[Turn budget] Turn {t} of 9.", t
        sent = items
        history += [
            {"role": "assistant", "content": [
                {"type": "text", "text": f"a{t}"},
                {"type": "tool_use", "id": f"toolu_{t}", "name": "Tool0", "input": {"c": t}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": f"toolu_{t}", "content": f"r{t}"}]}]
    assert made[2:] and all(made[2:]), made
