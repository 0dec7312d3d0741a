"""Every spelling of a path means one thing: a model call is counted whatever its spelling,
nothing reaches the upstream outside its base path, query strings go along, and an
upstream's redirect is never followed. The upstream records request lines off the wire."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import Proxy, ProxyFactory, assert_openai_error, chat_body, new_id
from recording_support import RecordingUpstream

UPSTREAM_KEY = "sk-upstream-secret"
CLIENT_KEY = "client-key-1"

# Spellings of model calls found to bypass the budget (each reached the upstream uncounted).
MODEL_CALL_SPELLINGS = [
    "/v1/./chat/completions", "/v1/%2e/chat/completions", "/v1/x/../chat/completions",
    "/v1/chat/./completions", "/v1/chat/x/%2e%2e/completions", "/v1/./responses",
    "/v1//chat/completions", "/v1/chat/completions/", "/v1/%63hat/%63ompletions",
    "/v1/Chat/Completions", "/v1/chat/%2E%2E/chat/completions",
]
# Spellings that reached the upstream outside its base path, with the operator's key.
TRAVERSALS = [
    "/v1/../admin", "/v1/%2e%2e/admin", "/v1/..%2fadmin", "/v1/..%2Fadmin", "/v1/..%5cadmin",
    "/v1/..\\admin", "/episodes/ok1/v1/../../admin", "/v1/chat/../../secret?x=1",
    "/v1/%2e%2e%2f%2e%2e%2fadmin", "/../v1/chat/completions", "/v1/a%00b",
]


@pytest.fixture(scope="module")
def recorder() -> Iterator[RecordingUpstream]:
    up = RecordingUpstream().start()
    yield up
    up.stop()


@pytest.fixture(scope="module")
def guarded(proxy: ProxyFactory, recorder: RecordingUpstream) -> Proxy:
    return proxy({"upstreams": [{"name": "rec", "base_url": recorder.base_url,
                                 "api_key": UPSTREAM_KEY}],
                  "auth": {"keys": [CLIENT_KEY]}})


def _raw(proxy: Proxy, method: str, target: str, body: bytes = b"",
         headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    """One request with the target exactly as given (HTTP clients normalise dot segments)."""
    host, port = proxy.url.removeprefix("http://").split(":")
    head = [f"{method} {target} HTTP/1.1", f"Host: {host}", f"Content-Length: {len(body)}",
            "Connection: close", f"Authorization: Bearer {CLIENT_KEY}",
            "Content-Type: application/json"]
    head += [f"{k}: {v}" for k, v in (headers or {}).items()]
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    status_line, _, rest = data.partition(b"\r\n")
    raw_headers, _, payload = rest.partition(b"\r\n\r\n")
    hdrs = {}
    for line in raw_headers.decode("latin-1").split("\r\n"):
        k, _, v = line.partition(":")
        hdrs[k.strip().lower()] = v.strip()
    if hdrs.get("transfer-encoding") == "chunked":
        payload = _dechunked(payload)
    return int(status_line.split()[1]), hdrs, payload


def _dechunked(data: bytes) -> bytes:
    out = b""
    while True:
        size_line, _, data = data.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            return out
        out, data = out + data[:size], data[size + 2:]


def _call(proxy: Proxy, target: str, eid: str, body: dict[str, Any] | None = None
          ) -> tuple[int, dict[str, str], dict[str, Any]]:
    body = body or chat_body(new_id("text"), model="rec")  # never a free retry of the last
    status, hdrs, payload = _raw(proxy, "POST", target, json.dumps(body).encode(),
                                 {"X-Episode-Id": eid, "X-Episode-Budget": "1"})
    return status, hdrs, json.loads(payload)


def _spent_episode(proxy: Proxy) -> str:
    eid = new_id("spell")
    status, _, _ = _call(proxy, "/v1/chat/completions", eid)
    assert status == 200
    status, _, err = _call(proxy, "/v1/chat/completions", eid)
    assert status == 403 and err["error"]["code"] == "turn_budget_exhausted"
    return eid


def _responses_body() -> dict[str, Any]:
    return {"model": "rec", "input": new_id("input")}


def _episode(proxy: Proxy, eid: str) -> dict[str, Any]:
    r = proxy.http(headers={"Authorization": f"Bearer {CLIENT_KEY}"}).get(f"/v1/episodes/{eid}")
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()
    return data


@pytest.mark.parametrize("spelling", MODEL_CALL_SPELLINGS)
def test_a_model_call_is_counted_whatever_its_spelling(
        guarded: Proxy, recorder: RecordingUpstream, spelling: str) -> None:
    eid = _spent_episode(guarded)
    before = len(recorder.seen)
    body = _responses_body() if "responses" in spelling else None
    status, hdrs, err = _call(guarded, spelling, eid, body)
    assert status == 403, (status, err)
    assert err["error"]["code"] == "turn_budget_exhausted"
    assert hdrs["x-episode-id"] == eid
    assert len(recorder.seen) == before, "a refused call reached the upstream"
    turns = guarded.wait_records(3, type="turn", episode_id=eid)
    assert [t["status"] for t in turns] == ["ok", "rejected", "rejected"]


@pytest.mark.parametrize("prefix", ["/episodes/{eid}/v1/./chat/completions",
                                    "/episodes/{eid}/v1/x/%2e%2e/chat/completions",
                                    "/episodes/{eid}//v1/chat/completions/"])
def test_the_path_prefix_form_is_counted_whatever_its_spelling(
        guarded: Proxy, recorder: RecordingUpstream, prefix: str) -> None:
    eid = _spent_episode(guarded)
    before = len(recorder.seen)
    status, _, payload = _raw(guarded, "POST", prefix.format(eid=eid),
                              json.dumps(chat_body(new_id("t"), model="rec")).encode())
    assert status == 403, payload
    assert json.loads(payload)["error"]["code"] == "turn_budget_exhausted"
    assert len(recorder.seen) == before


def test_the_first_call_in_an_odd_spelling_is_forwarded_as_the_canonical_route(
        guarded: Proxy, recorder: RecordingUpstream) -> None:
    eid = new_id("odd")
    status, hdrs, _ = _call(guarded, "/v1/x/../chat/./completions", eid)
    assert status == 200 and hdrs["x-episode-turn"] == "1"
    assert recorder.seen[-1].target == "/api/v1/chat/completions"
    assert _episode(guarded, eid)["turns_used"] == 1


@pytest.mark.parametrize("target", TRAVERSALS)
def test_nothing_reaches_the_upstream_outside_its_base_path(
        guarded: Proxy, recorder: RecordingUpstream, target: str) -> None:
    before = len(recorder.seen)
    for method in ("POST", "GET"):
        status, _, payload = _raw(guarded, method, target, b"{}")
        assert status in (400, 404), (method, target, status, payload)
        err = json.loads(payload)["error"]
        assert err["code"] in ("invalid_path", "not_found", "invalid_episode_id"), err
    assert len(recorder.seen) == before, recorder.targets()[before:]


def test_every_forwarded_request_stays_under_the_base_path(
        guarded: Proxy, recorder: RecordingUpstream) -> None:
    """Pass-through routes in odd spellings are forwarded canonical, under the base path."""
    before = len(recorder.seen)
    for target in ("/v1/files/./x", "/v1/a/b/../c", "/v1/models/%72ec", "/v1/embeddings/"):
        status, _, payload = _raw(guarded, "GET", target)
        assert status == 200, (target, payload)
    got = recorder.targets()[before:]
    assert got == ["/api/v1/files/x", "/api/v1/a/c", "/api/v1/models/rec", "/api/v1/embeddings"]
    assert all(s.headers["authorization"] == f"Bearer {UPSTREAM_KEY}"
               for s in recorder.seen[before:])


@pytest.mark.parametrize(("target", "body", "forwarded"), [
    ("/v1/chat/completions?api-version=2024-10-21", chat_body(model="rec"),
     "/api/v1/chat/completions?api-version=2024-10-21"),
    ("/v1/messages?beta=true", {"model": "rec", "max_tokens": 8,
                                "messages": [{"role": "user", "content": "hi"}]},
     "/api/v1/messages?beta=true"),
    ("/v1/responses?x=1&y=a%20b", {"model": "rec", "input": "hi"},
     "/api/v1/responses?x=1&y=a%20b"),
    ("/v1/embeddings?dims=8", {"model": "rec", "input": "hi"}, "/api/v1/embeddings?dims=8"),
])
def test_query_strings_reach_the_upstream_on_every_route(
        guarded: Proxy, recorder: RecordingUpstream, target: str, body: dict[str, Any],
        forwarded: str) -> None:
    status, _, payload = _raw(guarded, "POST", target, json.dumps(body).encode(),
                              {"X-Episode-Id": new_id("q")})
    assert status == 200, payload
    assert recorder.seen[-1].target == forwarded


def test_the_model_list_forwards_its_query(guarded: Proxy, recorder: RecordingUpstream) -> None:
    status, _, payload = _raw(guarded, "GET", "/v1/models?x=1")
    assert status == 200 and json.loads(payload)["data"][0]["id"] == "rec"
    assert recorder.seen[-1].target == "/api/v1/models?x=1"


def test_an_upstream_redirect_is_a_502_never_followed_and_the_turn_is_given_back(
        guarded: Proxy, recorder: RecordingUpstream) -> None:
    eid = new_id("redir")
    before = len(recorder.seen)
    status, hdrs, err = _call(guarded, "/v1/chat/completions", eid,
                              chat_body("please redirect", model="rec"))
    assert status == 502 and err["error"]["code"] == "upstream_redirect", err
    assert hdrs["x-should-retry"] == "false"
    assert len(recorder.seen) == before + 1, "the redirect was followed"
    ep = _episode(guarded, eid)
    assert ep["turns_used"] == 0 and ep["remaining"] == 1
    (rec,) = guarded.wait_records(1, type="turn", episode_id=eid)
    assert rec["status"] == "upstream_error" and rec["http_status"] == 502


def test_a_pass_through_redirect_is_a_502_never_followed(
        guarded: Proxy, recorder: RecordingUpstream) -> None:
    before = len(recorder.seen)
    status, _, payload = _raw(guarded, "POST", "/v1/embeddings",
                              json.dumps({"model": "rec", "input": "please redirect"}).encode())
    assert status == 502 and json.loads(payload)["error"]["code"] == "upstream_redirect"
    assert len(recorder.seen) == before + 1


def test_an_encoded_slash_is_refused_with_an_openai_error(guarded: Proxy) -> None:
    status, hdrs, payload = _raw(guarded, "GET", "/v1/models/a%2Fb")
    assert status == 400 and hdrs["x-should-retry"] == "false"
    assert json.loads(payload)["error"]["code"] == "invalid_path"


@pytest.mark.parametrize("target", ["/v1/chat/completions.", "/v1/chat/completions%20",
                                    "/v1/chat/completions%3f", "/v1/v1/chat/completions",
                                    "/v1/chat/completions%2e%2e", "/episodes/e1/v1/v1/responses",
                                    "/v1/x/v1/Messages"])
def test_a_near_spelling_of_a_model_route_is_not_forwarded(
        guarded: Proxy, recorder: RecordingUpstream, target: str) -> None:
    """An upstream that trims trailing dots, spaces or '?', or reads the last /v1/... of a
    path, would serve these as model calls the proxy did not count: a 404, nothing sent."""
    before = len(recorder.seen)
    status, _, payload = _raw(guarded, "POST", target, json.dumps(chat_body("x", model="rec")
                                                                  ).encode())
    assert status == 404, payload
    assert len(recorder.seen) == before


def test_a_pass_through_post_ending_in_messages_is_still_forwarded(
        guarded: Proxy, recorder: RecordingUpstream) -> None:
    """POST /v1/threads/{id}/messages (the Assistants API) is no near spelling of a route."""
    before = len(recorder.seen)
    _raw(guarded, "POST", "/v1/threads/t1/messages", b'{"role": "user", "content": "x"}')
    assert len(recorder.seen) == before + 1


@pytest.mark.parametrize("target", ["/v1/messages/%2f", "//v1/messages/%2f",
                                    "/V1/Messages/%5c", "/episodes/a%2fb/v1/messages",
                                    "/rollout/r/attempt/a%2fb/v1/messages/count_tokens"])
def test_a_refused_messages_path_gets_anthropics_error_shape(guarded: Proxy,
                                                             target: str) -> None:
    body = json.dumps({"model": "rec", "max_tokens": 8,
                       "messages": [{"role": "user", "content": "hi"}]}).encode()
    status, _, payload = _raw(guarded, "POST", target, body, {"X-Episode-Id": new_id("shape")})
    err = json.loads(payload)
    assert status == 400 and err["type"] == "error", err
    assert err["error"]["type"] == "invalid_request_error" and err["error"]["message"]


def test_the_usual_spelling_still_works_through_the_sdk(default_proxy: Proxy) -> None:
    r = default_proxy.http().post("/v1/chat/completions?x=1", json=chat_body(),
                                  headers={"X-Episode-Id": new_id("sdk")})
    assert r.status_code == 200
    r = default_proxy.http().get("/v1/models/m1/../../models")
    assert r.status_code == 200  # httpx sends it normalised; the proxy agrees
    assert_openai_error(default_proxy.http().get("/v1/a%5Cb"), 400, "invalid_path", "path")


def test_an_answer_that_stalls_mid_body_is_a_504_and_its_record_says_so(
        proxy: ProxyFactory, recorder: RecordingUpstream) -> None:
    """An upstream that stalls mid-body is a 504 to the client and in its turn record, and
    its turn is given back."""
    p = proxy({"upstreams": [{"name": "rec", "base_url": recorder.base_url,
                              "timeout_s": 0.5}]})
    eid = new_id("stall")
    r = p.http().post("/v1/chat/completions", json=chat_body("please stall", model="rec"),
                      headers={"X-Episode-Id": eid})
    assert_openai_error(r, 504, "upstream_timeout")
    (rec,) = p.wait_records(1, type="turn", episode_id=eid)
    assert rec["http_status"] == 504 and rec["status"] == "upstream_error"
    assert p.episode(eid)["turns_used"] == 0  # a timeout gives the turn back
