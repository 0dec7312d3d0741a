"""Errors: bad input, auth, size limits, upstream failures, disconnects; the proxy keeps serving."""

from __future__ import annotations

import time
from typing import Any

import httpx
import openai
import orjson
import pytest
from conftest import (
    Proxy,
    ProxyFactory,
    WatchedUpstream,
    assert_openai_error,
    chat_body,
    free_port,
    new_id,
)

from budgetproxy.testing import FakeUpstream

JSON = {"content-type": "application/json"}


def still_serving(p: Proxy) -> None:
    reply = p.client().chat.completions.create(
        model="m1", messages=[{"role": "user", "content": "still there?"}], timeout=5)
    assert reply.choices[0].message.content == "echo: still there?"


@pytest.fixture(scope="module")
def faulty(proxy: ProxyFactory, upstream: FakeUpstream) -> Proxy:
    """`dead-*` goes to a closed port, `slow-*` to an upstream with a 0.5 s timeout."""
    return proxy(
        {
            "server": {"max_body_bytes": 4096},
            "upstreams": [
                {"name": "dead", "base_url": f"http://127.0.0.1:{free_port()}/v1",
                 "models": ["dead-*"], "connect_timeout_s": 2},
                {"name": "slow", "base_url": upstream.base_url, "models": ["slow-*"],
                 "timeout_s": 0.5},
                {"name": "main", "base_url": upstream.base_url},
            ],
        }
    )


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/chat/completions", b'{"model": "m1", "messages": [', None),
        ("/v1/chat/completions", b"", None),
        ("/v1/chat/completions", b"[1, 2]", None),
        ("/v1/chat/completions", b'"just a string"', None),
        ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x"}]}', "model"),
        ("/v1/chat/completions", b'{"model": 7, "messages": [{"role": "user", "content": "x"}]}',
         "model"),
        ("/v1/chat/completions", b'{"model": "m1"}', "messages"),
        ("/v1/chat/completions", b'{"model": "m1", "messages": "hi"}', "messages"),
        ("/v1/chat/completions", b'{"model": "m1", "messages": ["hi"]}', "messages[0]"),
        ("/v1/chat/completions",
         b'{"model": "m1", "messages": [{"role": "user", "content": "x"}], "stream": "yes"}',
         "stream"),
        ("/v1/chat/completions",
         b'{"model": "m1", "messages": [{"role": "user", "content": "x"}], "stream": 1}',
         "stream"),
        ("/v1/completions", b'{"model": "m1"}', "prompt"),
        ("/v1/completions", b'{"model": "m1", "prompt": "x", "stream": "true"}', "stream"),
    ],
)
@pytest.mark.parametrize("episode", [False, True])
def test_bad_input_is_400_with_param(
    faulty: Proxy, upstream: FakeUpstream, path: str, body: bytes, param: str | None,
    episode: bool,
) -> None:
    before = len(upstream.requests)
    headers = {**JSON, **({"X-Episode-Id": new_id()} if episode else {})}
    with faulty.http() as http:
        r = http.post(path, content=body, headers=headers)
    assert_openai_error(r, 400, "invalid_request", param)
    assert len(upstream.requests) == before
    still_serving(faulty)


def test_bad_input_through_the_sdk_is_a_bad_request_error(faulty: Proxy) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        faulty.client().chat.completions.create(model="m1", messages=[])
    assert info.value.status_code == 400
    assert info.value.code == "invalid_request" and info.value.param == "messages"


def test_body_over_max_body_bytes_is_413(faulty: Proxy, upstream: FakeUpstream) -> None:
    big = orjson.dumps(chat_body("x" * 5000))
    before = len(upstream.requests)
    with faulty.http() as http:
        r = http.post("/v1/chat/completions", content=big,
                      headers={**JSON, "X-Episode-Id": new_id()})
        assert_openai_error(r, 413, "request_too_large")

        def chunked() -> Any:  # no content-length: the limit holds while reading
            for i in range(0, len(big), 1000):
                yield big[i : i + 1000]

        r = http.post("/v1/chat/completions", content=chunked(), headers=JSON)
        assert_openai_error(r, 413, "request_too_large")
        r = http.post("/v1/embeddings", content=orjson.dumps({"model": "m1", "input": "x" * 5000}),
                      headers=JSON)
        assert_openai_error(r, 413, "request_too_large")
    assert len(upstream.requests) == before
    still_serving(faulty)


@pytest.mark.parametrize("status", [400, 404, 422, 429, 500, 503])
@pytest.mark.parametrize("stream", [False, True])
def test_upstream_errors_pass_through_with_status_and_body(
    faulty: Proxy, status: int, stream: bool
) -> None:
    eid = new_id()
    body = chat_body("fail", stream=stream)
    with faulty.http() as http:
        r = http.post("/v1/chat/completions", json=body,
                      headers={"X-Episode-Id": eid, "X-Fake-Status": str(status)})
    assert r.status_code == status
    assert r.json() == {"error": {"message": f"injected fault {status}",
                                  "type": "server_error" if status >= 500
                                  else "invalid_request_error",
                                  "param": None,
                                  "code": "rate_limit_exceeded" if status == 429
                                  else "fake_fault"}}
    assert r.headers["x-episode-id"] == eid and r.headers["x-episode-turn"] == "1"
    still_serving(faulty)


def test_upstream_errors_reach_the_sdk_as_its_own_errors(faulty: Proxy) -> None:
    client = faulty.client()
    with pytest.raises(openai.InternalServerError) as info:
        client.chat.completions.create(model="m1", messages=[{"role": "user", "content": "x"}],
                                       extra_headers={"X-Fake-Status": "500"})
    assert info.value.status_code == 500
    with pytest.raises(openai.RateLimitError):
        client.chat.completions.create(model="m1", messages=[{"role": "user", "content": "x"}],
                                       extra_headers={"X-Fake-Status": "429"})


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("episode", [False, True])
def test_unreachable_upstream_is_502(faulty: Proxy, stream: bool, episode: bool) -> None:
    eid = new_id()
    with faulty.http() as http:
        r = http.post("/v1/chat/completions", json=chat_body("x", model="dead-1", stream=stream),
                      headers={"X-Episode-Id": eid} if episode else {})
    assert_openai_error(r, 502, "upstream_unreachable")
    if episode:
        assert r.headers["x-episode-id"] == eid
    still_serving(faulty)


def test_unreachable_upstream_on_pass_through_is_502(faulty: Proxy) -> None:
    with faulty.http() as http:
        r = http.post("/v1/embeddings", json={"model": "dead-1", "input": "x"})
    assert_openai_error(r, 502, "upstream_unreachable")


@pytest.mark.parametrize("stream", [False, True])
def test_timed_out_upstream_is_504(faulty: Proxy, stream: bool) -> None:
    t0 = time.monotonic()
    with faulty.http() as http:
        r = http.post("/v1/chat/completions", json=chat_body("x", model="slow-1", stream=stream),
                      headers={"X-Episode-Id": new_id(), "X-Fake-Delay-Ms": "3000"})
    assert_openai_error(r, 504, "upstream_timeout")
    assert time.monotonic() - t0 < 2.5
    still_serving(faulty)


def test_timed_out_pass_through_is_504(faulty: Proxy) -> None:
    with faulty.http() as http:
        r = http.post("/v1/embeddings", json={"model": "slow-1", "input": "x"},
                      headers={"X-Fake-Delay-Ms": "3000"})
    assert_openai_error(r, 504, "upstream_timeout")


def test_client_disconnect_mid_stream_cancels_the_upstream_call(
    faulty: Proxy, upstream: WatchedUpstream
) -> None:
    eid = new_id()
    before = len(upstream.stream_ends)
    body = chat_body("a b c d e f g h i j k l m n o p q r s t u v w x y z " * 4, stream=True)
    headers = {"X-Episode-Id": eid, "X-Fake-Chunks": "60", "X-Fake-Chunk-Gap-Ms": "100"}
    with faulty.http() as http, http.stream("POST", "/v1/chat/completions", json=body,
                                            headers=headers) as r:
        assert r.status_code == 200
        first = next(r.iter_bytes())
        assert first.startswith(b"data: ")
        t_closed = time.monotonic()
    # The stream would run ~6 s; the upstream must see its connection closed right away.
    deadline = time.monotonic() + 4
    while len(upstream.stream_ends) == before and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(upstream.stream_ends) > before, "upstream stream kept running"
    how, when = upstream.stream_ends[before]
    assert how == "closed" and when - t_closed < 4.0  # (the stream would run ~6 s)
    still_serving(faulty)
    # The turn was charged (bytes had reached the client) and the episode still works.
    assert faulty.episode(eid)["turns_used"] == 1
    (rec,) = faulty.wait_records(1, type="turn", episode_id=eid)
    assert (rec["status"], rec["http_status"]) == ("client_closed", 200)  # no upstream fault
    faulty.client().chat.completions.create(model="m1", messages=[{"role": "user", "content": "y"}],
                                            extra_headers={"X-Episode-Id": eid})
    assert faulty.episode(eid)["turns_used"] == 2


def test_client_disconnect_while_waiting_for_upstream(faulty: Proxy) -> None:
    with faulty.http(timeout=0.3) as http, pytest.raises(httpx.ReadTimeout):
        http.post("/v1/chat/completions", json=chat_body("x"),
                  headers={"X-Episode-Id": new_id(), "X-Fake-Delay-Ms": "1500"})
    still_serving(faulty)


@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", "/v1/chat/completions"), ("POST", "/v1/nowhere"), ("GET", "/nothing"),
     ("DELETE", "/v1/episodes/x"), ("POST", "/episodes/abc/v1/nowhere")],
)
def test_unknown_routes_are_never_a_500(faulty: Proxy, method: str, path: str) -> None:
    with faulty.http() as http:
        r = http.request(method, path)
    assert 400 <= r.status_code < 500, (r.status_code, r.text)
    still_serving(faulty)


@pytest.mark.parametrize(
    ("method", "path", "status", "code"),
    [("GET", "/nothing", 404, "not_found"), ("PUT", "/healthz", 405, "method_not_allowed"),
     ("POST", "/readyz", 405, "method_not_allowed")],
)
def test_the_proxys_own_route_errors_are_openai_shaped(
    faulty: Proxy, method: str, path: str, status: int, code: str
) -> None:
    with faulty.http() as http:
        r = http.request(method, path)
    assert_openai_error(r, status, code)


@pytest.mark.parametrize(
    ("method", "path", "status", "allow"),
    [("DELETE", "/v1/episodes/e-1", 405, "GET"), ("PUT", "/v1/episodes", 405, "POST"),
     ("GET", "/v1/episodes/e-1/outcome", 405, "POST"), ("GET", "/v1/episodes/e-1/end", 405, "POST"),
     ("GET", "/episodes/e-1/v1/episodes/e-1/outcome", 405, "POST"),
     ("POST", "/v1/episodes/e-1/nothing", 404, None),
     # a trailing slash is dropped before routing (core.paths): the route itself answers
     ("GET", "/v1/episodes/", 405, "POST"), ("POST", "/v1/episodes/e-1//x", 404, None),
     # the trajectory route and the group API are the proxy's own too
     ("POST", "/v1/episodes/e-1/trajectory", 405, "GET"), ("GET", "/v1/groups", 405, "POST"),
     ("POST", "/v1/groups/t/g", 405, "GET"), ("GET", "/v1/groups/t", 404, None),
     ("GET", "/v1/groups/./t", 404, None), ("DELETE", "/v1/groups/t/g/x", 404, None)],
)
def test_the_episode_api_is_never_sent_upstream(
    faulty: Proxy, upstream: FakeUpstream, method: str, path: str, status: int, allow: str | None
) -> None:
    """/v1/episodes and /v1/groups are the proxy's own: a wrong method or sub-route is its
    error, not a pass-through call the upstream answers."""
    before = len(upstream.requests)
    with faulty.http() as http:
        r = http.request(method, path, json={} if method in ("POST", "PUT") else None)
    assert_openai_error(r, status, "method_not_allowed" if status == 405 else "not_found")
    assert r.headers.get("allow") == allow
    assert len(upstream.requests) == before


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions", "/v1/responses",
                                   "/v1/messages", "/episodes/e-1/v1/Chat/Completions"])
@pytest.mark.parametrize("method", ["PUT", "PATCH", "DELETE", "GET"])
def test_a_model_call_by_another_method_is_never_sent_upstream(
    faulty: Proxy, upstream: FakeUpstream, method: str, route: str
) -> None:
    """An upstream that reads any method (or a GET's body) as a model call would serve these
    uncounted: a method other than the reads is a 405, a read with a body a 400."""
    before = len(upstream.requests)
    with faulty.http() as http:
        r = http.request(method, route, json=chat_body("x"),
                         headers={"X-Episode-Id": new_id()})
    if "messages" in route:
        assert r.status_code == (405 if method != "GET" else 400), r.text
        assert r.json()["type"] == "error"  # Anthropic's shape on its route
    elif method == "GET":
        assert_openai_error(r, 400, "invalid_request")
    else:
        assert_openai_error(r, 405, "method_not_allowed")
        assert r.headers["allow"] == "POST, GET, HEAD, OPTIONS"
    assert len(upstream.requests) == before


def test_a_read_of_a_model_route_without_a_body_is_forwarded(
    faulty: Proxy, upstream: FakeUpstream
) -> None:
    """GET /v1/chat/completions lists stored completions on OpenAI: forwarded as it is."""
    before = len(upstream.requests)
    with faulty.http() as http:
        http.get("/v1/chat/completions?limit=2")
    assert len(upstream.requests) == before + 1


@pytest.fixture(scope="module")
def guarded(proxy: ProxyFactory, upstream: FakeUpstream) -> Proxy:
    return proxy({"auth": {"keys": ["proxy-key-1", "proxy-key-2"]},
                  "upstreams": [{"name": "main", "base_url": upstream.base_url,
                                 "api_key": "sk-upstream-A"}]})


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/v1/chat/completions", chat_body("x")),
        ("POST", "/episodes/auth-ep/v1/chat/completions", chat_body("x")),
        ("POST", "/v1/completions", {"model": "m1", "prompt": "x"}),
        ("POST", "/v1/embeddings", {"model": "m1", "input": "x"}),
        ("GET", "/v1/models", None),
        ("POST", "/v1/episodes", {}),
        ("GET", "/v1/episodes/auth-ep", None),
    ],
)
@pytest.mark.parametrize("key", [None, "wrong-key"])
def test_auth_keys_required(
    guarded: Proxy, upstream: FakeUpstream, method: str, path: str, body: Any, key: str | None
) -> None:
    before = len(upstream.requests)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    with guarded.http() as http:
        r = http.request(method, path, json=body, headers=headers)
    assert_openai_error(r, 401, "invalid_api_key")
    assert len(upstream.requests) == before


def test_auth_key_accepted_and_never_forwarded(guarded: Proxy, upstream: FakeUpstream) -> None:
    with pytest.raises(openai.AuthenticationError):
        guarded.client(api_key="nope").chat.completions.create(
            model="m1", messages=[{"role": "user", "content": "x"}])
    for key in ("proxy-key-1", "proxy-key-2"):
        reply = guarded.client(api_key=key).chat.completions.create(
            model="m1", messages=[{"role": "user", "content": "authed"}],
            extra_headers={"X-Episode-Id": new_id()})
        assert reply.choices[0].message.content == "echo: authed"
        assert upstream.requests[-1].headers["authorization"] == "Bearer sk-upstream-A"
    assert [m.id for m in guarded.client(api_key="proxy-key-1").models.list().data]
