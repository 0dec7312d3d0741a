"""The JSONL trajectory log: record shapes, new messages only, episode records, content, secrets."""

from __future__ import annotations

import re
from typing import Any

import httpx
import orjson
import pytest
from conftest import Proxy, ProxyFactory, chat_body, new_id, read_jsonl

from budgetproxy.testing import FakeUpstream

RFC3339_UTC = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|\+00:00)$")
TURN_FIELDS = {
    "schema", "type", "episode_id", "turn", "attempt", "ts", "latency_s", "model", "status",
    "http_status", "request_messages", "messages_offset", "response", "finish_reason", "usage",
    "budget", "remaining", "disclosure",
}
EPISODE_FIELDS = {
    "schema", "type", "episode_id", "task_id", "group", "tags", "model", "budget", "max_turns",
    "tier", "disclosure", "announced_budget", "turns_used", "outcome", "success_turn", "reward",
    "exhausted", "end_reason", "started_at", "ended_at",
}
CLIENT_KEY = "sk-client-very-secret-1111"
UPSTREAM_KEY = "sk-upstream-very-secret-2222"
PROXY_KEY = "proxy-key-very-secret-3333"


@pytest.fixture(scope="module")
def logged(proxy: ProxyFactory, upstream: FakeUpstream) -> Proxy:
    return proxy({"budget": {"free_retries_per_turn": 1}, "upstreams": [
        {"name": "main", "base_url": upstream.base_url, "api_key": UPSTREAM_KEY}]})


def post(p: Proxy, path: str, body: Any, **headers: str) -> httpx.Response:
    return p.http().post(path, json=body, headers=headers)


def conversation(p: Proxy, eid: str) -> list[list[Any]]:
    """Three turns of a growing conversation, through the SDK, ending with a tool call."""
    client = p.client(api_key=CLIENT_KEY, default_headers={
        "X-Episode-Id": eid, "X-Episode-Budget": "4", "X-Episode-Max-Turns": "8",
        "X-Episode-Task": "task-log", "X-Episode-Group": "g-log"})
    history: list[Any] = [{"role": "system", "content": "sys"},
                          {"role": "user", "content": "first"}]
    sent = []
    client.chat.completions.create(model="m1", messages=history)
    sent.append(list(history))
    history += [{"role": "assistant", "content": "echo: first"},
                {"role": "user", "content": "second"}]
    list(client.chat.completions.create(model="m1", messages=history, stream=True))
    sent.append(list(history))
    history += [{"role": "assistant", "content": "echo: second"},
                {"role": "user", "content": "use a tool"}]
    client.chat.completions.create(
        model="m1", messages=history,
        tools=[{"type": "function", "function": {"name": "move", "parameters": {
            "type": "object", "properties": {"d": {"type": "string"}}}}}])
    sent.append(list(history))
    return sent


def test_turn_records(logged: Proxy) -> None:
    eid = new_id()
    sent = conversation(logged, eid)
    # (in turn order: a streamed turn's record is written once it settles, which can come
    # after the next turn's)
    recs = sorted(logged.wait_records(3, type="turn", episode_id=eid), key=lambda r: r["turn"])
    assert [r["turn"] for r in recs] == [1, 2, 3]
    for r in recs:
        assert TURN_FIELDS <= set(r), TURN_FIELDS - set(r)
        assert r["schema"] == 1 and r["type"] == "turn"
        assert RFC3339_UTC.match(r["ts"]), r["ts"]
        assert isinstance(r["latency_s"], float) and r["latency_s"] >= 0
        assert (r["model"], r["status"], r["http_status"], r["attempt"]) == ("m1", "ok", 200, 1)
        assert r["budget"] == 4 and r["disclosure"] == {"arm": "hidden", "text": None}
        assert set(r["response"]) >= {"content"} and r["usage"]["total_tokens"] > 0
    assert [r["remaining"] for r in recs] == [3, 2, 1]
    # Only messages new since the previous turn, and where they start in the full list.
    assert [(r["messages_offset"], r["request_messages"]) for r in recs] == [
        (0, sent[0]), (2, sent[1][2:]), (4, sent[2][4:])]
    assert recs[0]["response"]["content"] == "echo: first"
    assert recs[1]["response"]["content"] == "echo: second"  # reassembled from the stream
    assert [r["finish_reason"] for r in recs] == ["stop", "stop", "tool_calls"]
    calls = recs[2]["response"]["tool_calls"]
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in calls] == [
        ("move", '{"d":"fake"}')]


def test_streamed_tool_calls_are_logged(logged: Proxy) -> None:
    eid = new_id()
    client = logged.client(default_headers={"X-Episode-Id": eid, "X-Fake-Parallel-Tools": "2"})
    list(client.chat.completions.create(
        model="m1", messages=[{"role": "user", "content": "go"}], stream=True,
        tools=[{"type": "function", "function": {"name": "look", "parameters": {}}}]))
    rec = logged.wait_records(type="turn", episode_id=eid)[0]
    assert rec["finish_reason"] == "tool_calls"
    assert [(c["id"], c["function"]["name"]) for c in rec["response"]["tool_calls"]] == [
        ("call_0", "look"), ("call_1", "look")]


def test_rewritten_history_logs_from_the_start(logged: Proxy) -> None:
    eid = new_id()
    post(logged, "/v1/chat/completions",
         {"model": "m1", "messages": [{"role": "user", "content": f"m{i}"} for i in range(4)]},
         **{"X-Episode-Id": eid})
    post(logged, "/v1/chat/completions",
         {"model": "m1", "messages": [{"role": "user", "content": "summary"}]},
         **{"X-Episode-Id": eid})
    recs = logged.wait_records(2, type="turn", episode_id=eid)
    assert recs[1]["messages_offset"] == 0
    assert recs[1]["request_messages"] == [{"role": "user", "content": "summary"}]


def rebuilt(records: list[dict[str, Any]]) -> list[list[Any]]:
    """Each turn's conversation as a log reader rebuilds it: the previous one up to
    `messages_offset`, then `request_messages` (an offset of 0 starts over)."""
    out: list[list[Any]] = []
    full: list[Any] = []
    for r in records:
        full = [*full[: r["messages_offset"]], *r["request_messages"]]
        out.append(full)
    return out


def test_a_conversation_rebuilds_from_its_records_whatever_the_client_does(
    logged: Proxy,
) -> None:
    """Appends log only what is new; an edit of an earlier message, a truncation or a
    summary that grows back past the old length log the whole conversation again."""
    eid = new_id()
    sys_, u = {"role": "system", "content": "sys"}, [
        {"role": "user", "content": f"u{i}"} for i in range(8)]
    a = [{"role": "assistant", "content": f"a{i}"} for i in range(8)]
    sent = [
        [sys_, u[0]],
        [sys_, u[0], a[0], u[1]],                                  # append
        [sys_, {"role": "user", "content": "u0, edited"}, a[0], u[1], a[1], u[2]],  # edit
        [sys_, u[3]],                                              # truncate
        [sys_, {"role": "user", "content": "summary"}, u[4], a[4], u[5], a[5]],  # regrow
        [sys_, {"role": "user", "content": "summary"}, u[4], a[4], u[5], a[5], u[6]],
        [sys_, {"role": "user", "content": "summary"}, u[4], a[4], u[5],
         {"role": "assistant", "content": "a5, edited"}, u[6]],   # same length, changed
    ]
    for messages in sent:
        assert post(logged, "/v1/chat/completions", {"model": "m1", "messages": messages},
                    **{"X-Episode-Id": eid, "X-Episode-Budget": "10"}).status_code == 200
    recs = logged.wait_records(len(sent), type="turn", episode_id=eid)
    assert rebuilt(recs) == sent
    assert [r["messages_offset"] for r in recs] == [0, 2, 0, 0, 0, 6, 0]
    assert [len(r["request_messages"]) for r in recs] == [2, 2, 6, 2, 6, 1, 7]


def test_a_refused_call_after_a_rewrite_logs_the_whole_conversation(logged: Proxy) -> None:
    eid = new_id()
    first = [{"role": "user", "content": "one"}, {"role": "assistant", "content": "two"}]
    post(logged, "/v1/chat/completions", {"model": "m1", "messages": first},
         **{"X-Episode-Id": eid, "X-Episode-Budget": "1"})
    shrunk = [{"role": "user", "content": "three"}, {"role": "user", "content": "four"}]
    assert post(logged, "/v1/chat/completions", {"model": "m1", "messages": shrunk},
                **{"X-Episode-Id": eid}).status_code == 403
    recs = logged.wait_records(2, type="turn", episode_id=eid)
    assert (recs[1]["status"], recs[1]["messages_offset"], recs[1]["request_messages"]) == (
        "rejected", 0, shrunk)


def test_responses_continuing_a_stored_response_log_their_input(logged: Proxy) -> None:
    """With previous_response_id the client sends only the new items: they are all new."""
    eid = new_id()
    first = post(logged, "/v1/responses", {"model": "m1", "input": "start"},
                 **{"X-Episode-Id": eid})
    assert first.status_code == 200
    new_items = [{"type": "function_call_output", "call_id": "c1", "output": "done"}]
    for _ in range(2):
        assert post(logged, "/v1/responses", {
            "model": "m1", "input": new_items, "previous_response_id": first.json()["id"]},
            **{"X-Episode-Id": eid}).status_code == 200
    recs = logged.wait_records(3, type="turn", episode_id=eid)
    assert recs[0]["request_messages"] == [{"role": "user", "content": "start"}]
    for r in recs[1:]:
        assert (r["messages_offset"], r["request_messages"]) == (0, new_items)
        assert r["previous_response_id"] == first.json()["id"]
    assert "previous_response_id" not in recs[0]


def test_statuses_and_attempts(logged: Proxy) -> None:
    eid = new_id()
    body = chat_body("x")
    assert post(logged, "/v1/chat/completions", body,
                **{"X-Episode-Id": eid, "X-Episode-Budget": "2", "X-Fake-Status": "502"}
                ).status_code == 502
    assert post(logged, "/v1/chat/completions", body, **{"X-Episode-Id": eid}).status_code == 200
    assert post(logged, "/v1/chat/completions", body, **{"X-Episode-Id": eid}).status_code == 200
    assert post(logged, "/v1/chat/completions", chat_body("y"),
                **{"X-Episode-Id": eid}).status_code == 200
    assert post(logged, "/v1/chat/completions", chat_body("z"),
                **{"X-Episode-Id": eid}).status_code == 403
    recs = logged.wait_records(5, type="turn", episode_id=eid)
    assert [(r["turn"], r["attempt"], r["status"], r["http_status"]) for r in recs][:4] == [
        (1, 1, "upstream_error", 502), (1, 2, "ok", 200), (1, 3, "ok", 200), (2, 1, "ok", 200)]
    assert (recs[4]["status"], recs[4]["http_status"]) == ("rejected", 403)
    assert [r["remaining"] for r in recs] == [2, 1, 1, 0, 0]


def test_episode_record_once_with_contract_fields(logged: Proxy) -> None:
    eid = new_id()
    conversation(logged, eid)
    report = {"success": True, "reward": 0.75, "success_turn": 2}
    assert post(logged, f"/v1/episodes/{eid}/outcome", report).status_code == 200
    assert post(logged, f"/v1/episodes/{eid}/outcome", report).status_code == 200
    assert post(logged, f"/v1/episodes/{eid}/end", None).status_code == 200
    recs = logged.wait_records(type="episode", episode_id=eid)
    assert len(recs) == 1
    rec = recs[0]
    assert EPISODE_FIELDS <= set(rec), EPISODE_FIELDS - set(rec)
    assert {k: rec[k] for k in EPISODE_FIELDS - {"started_at", "ended_at"}} == {
        "schema": 1, "type": "episode", "episode_id": eid, "task_id": "task-log",
        "group": "g-log", "tags": {}, "model": "m1", "budget": 4, "max_turns": 8,
        "tier": "50%", "disclosure": "hidden", "announced_budget": None, "turns_used": 3,
        "outcome": "success", "success_turn": 2, "reward": 0.75, "exhausted": False,
        "end_reason": "success",
    }
    assert RFC3339_UTC.match(rec["started_at"]) and RFC3339_UTC.match(rec["ended_at"])
    assert rec["started_at"] <= rec["ended_at"]


def test_episode_created_by_api_records_tags(logged: Proxy) -> None:
    eid = new_id()
    r = post(logged, "/v1/episodes", {"episode_id": eid, "budget": 1, "tags": {"run": "r1"},
                                      "disclosure": "disclosed", "announced_budget": 3})
    assert r.status_code == 201
    post(logged, "/v1/chat/completions", chat_body(), **{"X-Episode-Id": eid})
    post(logged, f"/v1/episodes/{eid}/outcome", {"success": False})
    rec = logged.wait_records(type="episode", episode_id=eid)[0]
    assert (rec["tags"], rec["disclosure"], rec["announced_budget"], rec["outcome"],
            rec["end_reason"], rec["exhausted"]) == (
        {"run": "r1"}, "disclosed", 3, "failure", "exhausted", True)
    # The episode's model is the one its turns used, also when the API created it.
    assert rec["model"] == "m1"


def test_content_none_leaves_texts_out_and_keeps_lengths(
    proxy: ProxyFactory, upstream: FakeUpstream
) -> None:
    p = proxy({"trajectories": {"content": "none"}, "disclosure": {"mode": "disclosed"}})
    eid = new_id()
    secret_text = "the password is swordfish"
    client = p.client(default_headers={"X-Episode-Id": eid, "X-Episode-Budget": "3"})
    client.chat.completions.create(model="m1", messages=[
        {"role": "user", "content": secret_text},
        {"role": "user", "content": [{"type": "text", "text": "part text"}]}])
    client.chat.completions.create(
        model="m1", messages=[{"role": "user", "content": "call a tool"}],
        tools=[{"type": "function", "function": {"name": "move", "parameters": {
            "type": "object", "properties": {"where": {"type": "string"}}}}}])
    post(p, f"/v1/episodes/{eid}/end", None)
    recs = p.wait_records(3, episode_id=eid)
    dump = orjson.dumps(recs).decode()
    for text in (secret_text, "part text", "echo:", "Turn budget", "call a tool", '"where"'):
        assert text not in dump, text
    first, second = recs[0], recs[1]
    assert first["request_messages"][0]["role"] == "user"
    assert first["request_messages"][0]["content"] == {"length": len(secret_text)}
    part = first["request_messages"][1]["content"][0]
    assert part["type"] == "text" and part["text"] == {"length": len("part text")}
    # (a lone text part takes the disclosure text into its own text, as a string would)
    upstream_text = upstream.requests[-2].json["messages"][-1]["content"][-1]["text"]
    assert upstream_text.startswith("part text\n\n")
    told = upstream_text.removeprefix("part text\n\n")
    assert first["disclosure"]["text"] == {"length": len(told)}
    # (the fake answers "echo: " + the text parts of the last message, joined)
    assert first["response"]["content"] == {"length": len("echo: " + upstream_text)}
    call = second["response"]["tool_calls"][0]
    assert call["function"]["name"] == "move"
    assert call["function"]["arguments"] == {"length": len('{"where":"fake"}')}
    assert first["usage"]["total_tokens"] > 0 and first["turn"] == 1


def test_credentials_never_appear(proxy: ProxyFactory, upstream: FakeUpstream) -> None:
    p = proxy({"auth": {"keys": [PROXY_KEY]}, "upstreams": [
        {"name": "main", "base_url": upstream.base_url, "api_key": UPSTREAM_KEY}]})
    eid = new_id()
    client = p.client(api_key=PROXY_KEY, default_headers={
        "X-Episode-Id": eid, "x-api-key": CLIENT_KEY, "OpenAI-Organization": "org-secret"})
    client.chat.completions.create(model="m1", messages=[{"role": "user", "content": "hi"}])
    list(client.chat.completions.create(model="m1", messages=[{"role": "user", "content": "s"}],
                                        stream=True))
    with pytest.raises(Exception):  # noqa: B017 - any SDK error
        client.chat.completions.create(model="m1", messages=[{"role": "user", "content": "e"}],
                                       extra_headers={"X-Fake-Status": "500"})
    r = p.http().post(f"/v1/episodes/{eid}/outcome", json={"success": True},
                      headers={"Authorization": f"Bearer {PROXY_KEY}"})
    assert r.status_code == 200
    recs = p.wait_records(4, episode_id=eid)
    assert len(recs) == 4
    text = "\n".join(path.read_text() for path in p.log_dir.glob("*.jsonl"))
    for secret in (PROXY_KEY, UPSTREAM_KEY, CLIENT_KEY, "Bearer", "org-secret"):
        assert secret not in text, secret
    assert upstream.requests[-1].headers["authorization"] == f"Bearer {UPSTREAM_KEY}"


def test_every_record_has_schema_and_type(default_proxy: Proxy) -> None:
    eid = new_id()
    post(default_proxy, "/v1/chat/completions", chat_body(), **{"X-Episode-Id": eid})
    post(default_proxy, f"/v1/episodes/{eid}/end", None)
    default_proxy.wait_records(type="episode", episode_id=eid)
    records = read_jsonl(default_proxy.log_dir)
    assert records
    for r in records:
        assert r["schema"] == 1 and r["type"] in ("turn", "episode")


def test_a_retry_record_reads_on_its_own(logged: Proxy) -> None:
    """A later attempt of a turn logs its conversation whole, not an empty tail that only the
    failed attempt's record explains."""
    eid = new_id()
    post(logged, "/v1/chat/completions", chat_body("first"), **{"X-Episode-Id": eid})
    body = {"model": "m1", "messages": [{"role": "user", "content": "first"},
                                        {"role": "assistant", "content": "echo: first"},
                                        {"role": "user", "content": "second"}]}
    assert post(logged, "/v1/chat/completions", body,
                **{"X-Episode-Id": eid, "X-Fake-Status": "503"}).status_code == 503
    assert post(logged, "/v1/chat/completions", body, **{"X-Episode-Id": eid}).status_code == 200
    recs = logged.wait_records(3, type="turn", episode_id=eid)
    assert [(r["turn"], r["attempt"]) for r in recs] == [(1, 1), (2, 1), (2, 2)]
    assert recs[1]["messages_offset"] == 1
    assert (recs[2]["messages_offset"], recs[2]["request_messages"]) == (0, body["messages"])
