"""Odd requests at a running proxy: each gets a clear 400 (or a normal answer), never a 500 or
a hang; its turn is charged only if it was forwarded, and the trajectory log is still written
afterwards."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from conftest import Proxy, ProxyFactory, assert_openai_error, chat_body, nested, new_id


def _post(proxy: Proxy, path: str, body: Any, headers: dict[str, Any] | None = None
          ) -> httpx.Response:
    return proxy.http().post(path, content=json.dumps(body),
                             headers={"content-type": "application/json", **(headers or {})})


def _still_logging(proxy: Proxy) -> None:
    """A normal call afterwards is answered and its turn record reaches the log."""
    eid = new_id("after")
    r = _post(proxy, "/v1/chat/completions", chat_body("still there?"), {"X-Episode-Id": eid})
    assert r.status_code == 200, r.text
    assert proxy.wait_records(1, type="turn", episode_id=eid), "the trajectory log stopped"


@pytest.fixture(scope="module")
def disclosed(proxy: ProxyFactory) -> Proxy:
    return proxy({"disclosure": {"mode": "disclosed"}})


@pytest.mark.parametrize(("header", "value"), [
    ("X-Episode-Task", b"\xff\xfe"), ("X-Episode-Group", b"\xe9t\xe9"),
    ("X-Episode-Budget", b"\xff"), ("X-Episode-Disclosure", b"\xff"),
])
def test_header_bytes_that_are_not_utf8_are_a_400(default_proxy: Proxy, header: str,
                                                 value: bytes) -> None:
    r = _post(default_proxy, "/v1/chat/completions", chat_body(),
              {"X-Episode-Id": new_id("bytes"), header: value})
    assert_openai_error(r, 400, "invalid_request")


@pytest.mark.parametrize("value", ["100000000000000000000", "2147483648", "+3", "1_0", "0x10"])
def test_budget_headers_take_plain_turn_counts(default_proxy: Proxy, value: str) -> None:
    r = _post(default_proxy, "/v1/chat/completions", chat_body(),
              {"X-Episode-Id": new_id("count"), "X-Episode-Budget": value})
    assert_openai_error(r, 400, "invalid_request", "budget")


def test_a_body_too_deep_to_rewrite_is_a_400_and_gives_its_turn_back(disclosed: Proxy) -> None:
    """The disclosed arm re-encodes the body, which orjson cannot past 254 levels: such a call
    is a 400, its turn given back, its record written."""
    eid = new_id("deep")
    body = chat_body("deep") | {"x": nested(300)}
    r = _post(disclosed, "/v1/chat/completions", body, {"X-Episode-Id": eid,
                                                        "X-Episode-Budget": "3"})
    assert_openai_error(r, 400, "invalid_request")
    ep = disclosed.episode(eid)
    assert ep["turns_used"] == 0 and ep["remaining"] == 3
    (rec,) = disclosed.wait_records(1, type="turn", episode_id=eid)
    assert rec["status"] == "rejected" and rec["http_status"] == 400
    r = _post(disclosed, "/v1/chat/completions", chat_body("shallow"), {"X-Episode-Id": eid})
    assert r.status_code == 200 and r.headers["x-episode-turn"] == "1"
    _still_logging(disclosed)


def test_a_forwarded_body_orjson_cannot_log_still_gets_its_record(default_proxy: Proxy
                                                                   ) -> None:
    """The hidden arm forwards the body untouched; its record carries the agent's messages,
    300 levels deep, and the trajectory writer goes on writing after it."""
    eid = new_id("deeplog")
    message = {"role": "user", "content": "hi", "x": nested(300)}
    r = _post(default_proxy, "/v1/chat/completions",
              {"model": "m1", "messages": [message]}, {"X-Episode-Id": eid})
    assert r.status_code == 200, r.text
    (rec,) = default_proxy.wait_records(1, type="turn", episode_id=eid)
    assert rec["request_messages"][0]["x"] == nested(300)
    _still_logging(default_proxy)


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/episodes", {"budget": 100000000000000000000}),
    ("/v1/episodes", {"max_turns": 2**31}),
    ("/v1/episodes", {"tags": {"a": 100000000000000000000}}),
    ("/v1/episodes", {"tags": {"a": nested(300)}}),
])
def test_episode_fields_the_log_cannot_hold_are_a_400(default_proxy: Proxy, path: str,
                                                      body: dict[str, Any]) -> None:
    """Episode fields the log cannot hold (integers past 64 bits or 2**31 turns, nesting past
    orjson's depth) are a 400 at creation, and no episode is created."""
    eid = new_id("big")
    r = _post(default_proxy, path, {"episode_id": eid, **body})
    assert_openai_error(r, 400, "invalid_request")
    assert default_proxy.http().get(f"/v1/episodes/{eid}").status_code == 404
    _still_logging(default_proxy)


@pytest.mark.parametrize("body", [
    {"success": True, "reward": "1.5"}, {"success": True, "reward": True},
    {"success": True, "metadata": {"x": nested(300)}},
    {"success": True, "metadata": {"n": 100000000000000000000}},
    {"success": True, "success_turn": 2**31},
])
def test_outcome_fields_are_taken_as_typed(default_proxy: Proxy, body: dict[str, Any]) -> None:
    eid = new_id("typed")
    assert _post(default_proxy, "/v1/episodes", {"episode_id": eid}).status_code == 201
    r = _post(default_proxy, f"/v1/episodes/{eid}/outcome", body)
    assert_openai_error(r, 400, "invalid_request")
    assert default_proxy.episode(eid)["status"] == "active"
    assert _post(default_proxy, f"/v1/episodes/{eid}/outcome",
                 {"success": True, "reward": 1}).status_code == 200  # an int is a number
    _still_logging(default_proxy)


def test_finish_mode_with_odd_stream_options_still_finishes(proxy: ProxyFactory) -> None:
    finishing = proxy({"budget": {"on_exhausted": "finish"}})
    eid = new_id("finish")
    headers = {"X-Episode-Id": eid, "X-Episode-Budget": "1"}
    assert _post(finishing, "/v1/chat/completions", chat_body("one"), headers).status_code == 200
    r = _post(finishing, "/v1/chat/completions",
              chat_body("two", stream=True, stream_options=[1]), headers)
    assert r.status_code == 200, r.text
    assert r.headers["x-episode-exhausted"] == "true"
    assert r.text.rstrip().endswith("data: [DONE]")


@pytest.fixture(scope="module")
def small_bodies(proxy: ProxyFactory) -> Proxy:
    return proxy({"server": {"max_body_bytes": 1000}})


@pytest.mark.parametrize("chunked", [False, True])
@pytest.mark.parametrize("route", ["create", "outcome"])
def test_the_episode_api_keeps_to_the_body_limit(small_bodies: Proxy, chunked: bool,
                                                 route: str) -> None:
    """Model calls answered 413 past server.max_body_bytes; the episode API took 5 MB."""
    eid = new_id("limit")
    if route == "outcome":
        assert _post(small_bodies, "/v1/episodes", {"episode_id": eid}).status_code == 201
        path, body = f"/v1/episodes/{eid}/outcome", {"success": True, "metadata": {}}
    else:
        path, body = "/v1/episodes", {"episode_id": eid, "tags": {}}
    key = "metadata" if route == "outcome" else "tags"
    body[key] = {"pad": "x" * 5000}
    data = json.dumps(body).encode()
    content: Any = iter([data[:600], data[600:]]) if chunked else data
    r = small_bodies.http().post(path, content=content,
                                 headers={"content-type": "application/json"})
    assert_openai_error(r, 413, "request_too_large")
    body[key] = {"pad": "x" * 100}
    assert _post(small_bodies, path, body).status_code in (200, 201)


@pytest.mark.parametrize("path", ["/episodes/bad%20id/v1/models", "/episodes/bad!id/v1/episodes"])
def test_a_bad_id_in_the_path_prefix_is_a_400_on_every_route(default_proxy: Proxy,
                                                             path: str) -> None:
    r = default_proxy.http().get(path)
    assert_openai_error(r, 400, "invalid_episode_id")


def test_an_encoded_slash_in_a_path_prefix_id_is_a_400_not_a_404(default_proxy: Proxy) -> None:
    """The server decodes `a%2Fb` to `a/b` before routing: an encoded slash in a path-prefix
    id is a bad id (400), never a route that does not exist (404)."""
    r = default_proxy.http().get("/episodes/a%2Fb/v1/models")
    assert_openai_error(r, 400, "invalid_episode_id")
    r = _post(default_proxy, "/episodes/a%2Fb/v1/chat/completions", chat_body())
    assert_openai_error(r, 400, "invalid_episode_id")


def test_without_a_key_it_is_401_before_the_body_is_judged(proxy: ProxyFactory) -> None:
    guarded = proxy({"auth": {"keys": ["k1"]}})
    r = _post(guarded, "/v1/episodes", {"budget": "not a number"})
    assert_openai_error(r, 401, "invalid_api_key")
    r = _post(guarded, "/v1/episodes", {"budget": "not a number"},
              {"Authorization": "Bearer k1"})
    assert_openai_error(r, 400, "invalid_request", "budget")


def test_listing_models_with_every_upstream_down_is_a_502(proxy: ProxyFactory) -> None:
    from conftest import free_port

    down = proxy({"upstreams": [{"name": "gone",
                                 "base_url": f"http://127.0.0.1:{free_port()}/v1"}]})
    r = down.http().get("/v1/models")
    assert_openai_error(r, 502, "upstream_unreachable")


def test_a_huge_tracestate_is_dropped_without_logging_it(
        upstream: Any, tmp_path: Any, caplog: pytest.LogCaptureFixture) -> None:
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from budgetproxy.config import load_config
    from budgetproxy.serve.server import ProxyServer

    exporter = InMemorySpanExporter()
    cfg = load_config(None, {"upstreams": [{"base_url": upstream.base_url}],
                             "trajectories": {"dir": str(tmp_path)}})
    with ProxyServer(cfg, span_processor=SimpleSpanProcessor(exporter)) as srv:
        r = httpx.post(srv.url + "/v1/chat/completions", json=chat_body(), headers={
            "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "tracestate": "v=" + "x" * 8000})
    assert r.status_code == 200, r.text
    assert not any(len(rec.getMessage()) > 2000 for rec in caplog.records)
    (span,) = exporter.get_finished_spans()
    assert span.parent is not None and span.parent.trace_id == 0x4bf92f3577b34da6a3ce929d0e0e4736


def test_an_empty_episode_id_is_a_400_not_an_uncounted_call(default_proxy: Proxy) -> None:
    """An unset variable in a header template sends X-Episode-Id: "" — counting nothing and
    enforcing no budget would hide that."""
    r = _post(default_proxy, "/v1/chat/completions", chat_body(), {"X-Episode-Id": ""})
    assert_openai_error(r, 400, "invalid_episode_id")


class _OddStreams:
    """An upstream whose SSE chunks carry fields of the wrong types."""

    CHUNKS = (
        b'{"choices":[{"index":0,"delta":{"tool_calls":"x"}}]}',
        b'{"choices":[{"index":0,"delta":"x"}]}',
        b'{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":'
        b'{"name":"f","arguments":{"city":"Paris"}}}]}}]}',
        b'{"choices":[{"index":0,"delta":{"tool_calls":[{"index":"1","function":'
        b'{"arguments":"{}"}}, 7]}}]}',
        b'{"choices":"none","usage":[1]}',
        b'{"choices":[{"index":0,"delta":{"content":"ok"},"finish_reason":"stop"}]}',
    )

    @classmethod
    def server(cls) -> Any:
        from aiohttp import web

        from budgetproxy.serve.local_server import LocalAiohttpServer

        class Server(LocalAiohttpServer):
            def build_app(self) -> web.Application:
                async def chat(request: web.Request) -> web.StreamResponse:
                    await request.read()
                    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
                    await resp.prepare(request)
                    for chunk in cls.CHUNKS:
                        await resp.write(b"data: " + chunk + b"\n\n")
                    await resp.write(b"data: [DONE]\n\n")
                    return resp

                app = web.Application()
                app.router.add_post("/v1/chat/completions", chat)
                return app

        return Server()


def test_an_upstream_stream_of_odd_types_still_gets_its_turn_record(
        tmp_path: Any) -> None:
    """A stream whose deltas have fields of the wrong type is relayed, charged and read back
    for its turn record, which holds what could be read."""
    from conftest import read_jsonl

    from budgetproxy.config import load_config
    from budgetproxy.serve.server import ProxyServer

    with _OddStreams.server() as odd:
        cfg = load_config(None, {"upstreams": [{"base_url": odd.base_url}],
                                 "trajectories": {"dir": str(tmp_path)},
                                 "disclosure": {"mode": "disclosed"}})
        with ProxyServer(cfg) as srv:
            eid = new_id("odd")
            r = httpx.post(srv.url + "/v1/chat/completions", headers={"X-Episode-Id": eid},
                           json=chat_body(stream=True))
            assert r.status_code == 200 and "[DONE]" in r.text
    (rec,) = [x for x in read_jsonl(tmp_path) if x["type"] == "turn"]
    assert rec["episode_id"] == eid and rec["status"] == "ok"
    assert rec["response"]["content"] == "ok" and rec["finish_reason"] == "stop"
    assert rec["response"]["tool_calls"][0]["function"]["name"] == "f"


def test_an_id_header_sent_twice_must_name_one_episode(default_proxy: Proxy) -> None:
    """Two X-Episode-Id lines with different ids are a 400 naming both; the same id twice is
    that episode."""
    a, b = new_id("twice"), new_id("twice")
    body = json.dumps(chat_body()).encode()
    r = default_proxy.http().post("/v1/chat/completions", content=body, headers=[
        ("content-type", "application/json"), ("X-Episode-Id", a), ("X-Episode-Id", b)])
    assert_openai_error(r, 400, "invalid_episode_id", "episode_id")
    assert a in r.json()["error"]["message"] and b in r.json()["error"]["message"]
    r = default_proxy.http().post("/v1/chat/completions", content=body, headers=[
        ("content-type", "application/json"), ("X-Episode-Id", a), ("X-Episode-Id", a)])
    assert r.status_code == 200 and r.headers["x-episode-id"] == a


def test_the_episode_api_asks_for_the_key_before_reading_the_body(proxy: ProxyFactory) -> None:
    guarded = proxy({"auth": {"keys": ["k1"]}})
    r = guarded.http().post("/v1/episodes", content=b"not json",
                            headers={"content-type": "application/json"})
    assert_openai_error(r, 401, "invalid_api_key")


@pytest.mark.parametrize("path", ["/episodes/slash-1/v1", "/v1"])
def test_no_route_is_a_404_naming_it_never_a_redirect(default_proxy: Proxy, path: str) -> None:
    """A POST to a path that is no route (/episodes/{id}/v1, /v1) is a 404 naming it, never a
    redirect, which would lose the episode id."""
    r = default_proxy.http().post(path, content=b"{}")
    assert_openai_error(r, 404, "not_found")
    assert "POST /v1" in r.json()["error"]["message"]


def test_an_empty_id_in_the_episode_api_is_a_400(default_proxy: Proxy) -> None:
    """`{"episode_id": ""}` is a bad id (400), not an episode under a generated id."""
    r = _post(default_proxy, "/v1/episodes", {"episode_id": ""})
    assert_openai_error(r, 400, "invalid_episode_id")


ODD_RESPONSES = [
    {"input": [1, "x", None]},
    {"input": [{"type": "function_call_output", "call_id": "c", "output": 5}]},
    {"input": [{"role": "user", "content": 7}], "instructions": ["not", "a", "string"]},
    {"input": None},
    {"input": {"role": "user"}},
    {"input": [], "previous_response_id": 12},
]
ODD_MESSAGES = [
    {"messages": [{"role": "user", "content": 5}], "system": 7},
    {"messages": [{"role": "user", "content": [1, None, {"type": "text"}]}]},
    {"messages": [{"role": "assistant", "content": "prefill"}]},
    {"messages": [{"role": "system", "content": "only a system message"}]},
    {"messages": [{"role": "user", "content": [{"type": "tool_result", "content": [
        {"type": "text", "text": "x", "cache_control": "odd"}]}]}], "system": [3]},
]


@pytest.mark.parametrize("placement", ["last_message", "system", "new_message"])
@pytest.mark.parametrize(("path", "extra"), [
    *(("/v1/responses", b) for b in ODD_RESPONSES),
    *(("/v1/messages", {"max_tokens": 8, **b}) for b in ODD_MESSAGES),
])
def test_odd_responses_and_messages_bodies_are_never_a_500(
        proxy: ProxyFactory, placement: str, path: str, extra: dict[str, Any]) -> None:
    p = proxy({"disclosure": {"mode": "disclosed", "placement": placement}})
    eid = new_id()
    r = _post(p, path, {"model": "m1", **extra}, {"X-Episode-Id": eid})
    assert r.status_code < 500, r.text
    if r.status_code == 200:
        assert p.wait_records(1, type="turn", episode_id=eid)
    _still_logging(p)


BIDI_AND_CONTROL = ["\u202e", "\u2066", "\u200f", "\x1b", "\x85", "\x07"]


@pytest.mark.parametrize("char", BIDI_AND_CONTROL)
def test_task_ids_groups_and_tags_with_bidi_or_control_characters_are_a_400(
        default_proxy: Proxy, char: str) -> None:
    """A right-to-left override (or a control character) in a task id, group or tag would
    reach logs, metric labels and dashboards reading other than it is."""
    evil = f"task{char}gpj.exe"
    eid = new_id("bidi")
    r = _post(default_proxy, "/v1/chat/completions", chat_body(),
              {"X-Episode-Id": eid, "X-Episode-Task": evil.encode("utf-8")})
    if char.isascii():  # the HTTP server refuses an ASCII control in a header itself
        assert r.status_code == 400
    else:
        assert_openai_error(r, 400, "invalid_request")
        assert r.json()["error"]["param"] == "task_id"
        assert f"U+{ord(char):04X}" in r.json()["error"]["message"]
    for body, param in (({"task_id": evil}, "task_id"), ({"group": evil}, "group"),
                        ({"tags": {"policy": evil}}, "tags"), ({"tags": {evil: 1}}, "tags"),
                        ({"tags": {"a": [{"b": evil}]}}, "tags")):
        r = _post(default_proxy, "/v1/episodes", body)
        assert r.status_code == 400, (body, r.text)
        assert param in r.text
    r = _post(default_proxy, "/v1/groups", {"task_id": evil, "group": "g", "size": 2})
    assert r.status_code == 400, r.text
    r = default_proxy.http().get(f"/v1/episodes/{eid}")
    assert r.status_code == 404  # nothing was created
    _still_logging(default_proxy)


def test_printable_text_of_any_script_is_kept(default_proxy: Proxy) -> None:
    r = _post(default_proxy, "/v1/episodes", {"task_id": "مهمة-١ 任务 😀",
                                              "tags": {"note": "שלום – ok"}})
    assert r.status_code == 201, r.text
