"""Only the headers an upstream needs reach it (core/forwarded_headers.py), on model calls
and pass-through routes; the operator can add names; credentials follow their own rules."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from conftest import Proxy, ProxyFactory, chat_body, new_id
from recording_support import RecordingUpstream

from budgetproxy.core.forwarded_headers import FORWARDED, HeaderPolicy

SENT = {
    "Accept": "application/json", "User-Agent": "agent/1.0", "OpenAI-Organization": "org-1",
    "OpenAI-Project": "proj-1", "OpenAI-Beta": "assistants=v2", "Anthropic-Version": "2023-06-01",
    "Anthropic-Beta": "tools-2024", "Idempotency-Key": "idem-1", "X-Request-Id": "req-1",
    "Cookie": "session=secret", "X-Forwarded-For": "10.0.0.1", "Forwarded": "for=10.0.0.1",
    "X-Real-Ip": "10.0.0.1", "X-Custom-Header": "nope", "X-Stainless-Retry-Count": "0",
    "X-Episode-Budget": "3", "X-Session": "alias-id-1", "Proxy-Authorization": "Basic eA==",
    "X-Gateway-Route": "blue",
}
EXPECTED = {"accept", "user-agent", "openai-organization", "openai-project", "openai-beta",
            "anthropic-version", "anthropic-beta", "idempotency-key", "x-request-id"}


@pytest.fixture(scope="module")
def recorder() -> Iterator[RecordingUpstream]:
    up = RecordingUpstream().start()
    yield up
    up.stop()


def _proxy(proxy: ProxyFactory, recorder: RecordingUpstream, **server: object) -> Proxy:
    return proxy({"upstreams": [{"name": "rec", "base_url": recorder.base_url,
                                 "api_key": "sk-up"}],
                  "episodes": {"id_headers": ["X-Session"]},
                  "server": {"forward_headers": [], **server}})


def _forwarded(recorder: RecordingUpstream) -> set[str]:
    wire = {"host", "content-length", "content-type", "authorization", "accept-encoding"}
    return set(recorder.seen[-1].headers) - wire


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/embeddings"])
def test_only_the_listed_headers_reach_the_upstream(proxy: ProxyFactory,
                                                    recorder: RecordingUpstream,
                                                    path: str) -> None:
    p = _proxy(proxy, recorder)
    r = p.http().post(path, json=chat_body(new_id("h"), model="rec"),
                      headers=SENT | {"Authorization": "Bearer client-own"})
    assert r.status_code == 200, r.text
    assert _forwarded(recorder) == EXPECTED
    assert recorder.seen[-1].headers["authorization"] == "Bearer sk-up"


def test_the_operator_adds_names_but_never_credentials_or_episode_headers(
        proxy: ProxyFactory, recorder: RecordingUpstream) -> None:
    p = _proxy(proxy, recorder, forward_headers=["x-gateway-*", "x-*", "cookie"])
    r = p.http().post("/v1/chat/completions", json=chat_body(new_id("h"), model="rec"),
                      headers=SENT)
    assert r.status_code == 200, r.text
    got = _forwarded(recorder)
    assert {"x-gateway-route", "x-custom-header", "x-stainless-retry-count"} <= got
    for never in ("cookie", "x-forwarded-for", "x-real-ip", "forwarded", "x-episode-budget",
                  "x-session", "proxy-authorization"):
        assert never not in got


def test_the_policy_decides_by_lowercase_name() -> None:
    policy = HeaderPolicy(["x-trace-*"], [b"x-session"])
    assert all(policy.forwarded(n) for n in FORWARDED)
    assert policy.forwarded(b"x-trace-id") and not policy.forwarded(b"x-session")
    assert not policy.forwarded(b"x-episode-id") and not policy.forwarded(b"authorization")


def test_a_requests_selected_headers_are_the_forwarded_ones_as_str() -> None:
    policy = HeaderPolicy(["x-trace-*"], [b"x-session"])
    headers = {b"accept": b"*/*", b"x-trace-id": b"t\xe9", b"x-session": b"s",
               b"authorization": b"Bearer k", b"x-episode-id": b"e", b"host": b"h"}
    for _ in range(2):  # decided, then read from the cache
        assert policy.selected(headers) == {"accept": "*/*", "x-trace-id": "t\xe9"}
