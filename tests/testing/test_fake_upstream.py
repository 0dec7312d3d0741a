"""The fake upstream answers like an OpenAI-compatible server and injects faults on request."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
from conftest import ProxyFactory

from budgetproxy.testing import FakeUpstream

CHAT = {"model": "m1", "messages": [{"role": "user", "content": "hello there world"}]}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "move",
            "parameters": {"type": "object", "properties": {"direction": {"type": "string"}}},
        },
    },
    {"type": "function", "function": {"name": "look", "parameters": {"type": "object"}}},
]


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstream]:
    with FakeUpstream(models=["m1", "m2"]) as fake:
        yield fake


@pytest.fixture()
def client(upstream: FakeUpstream) -> Iterator[httpx.Client]:
    upstream.reset()
    with httpx.Client(base_url=upstream.base_url, timeout=10) as c:
        yield c


def sse_events(text: str) -> list[Any]:
    """Parse ``data:`` events; ``[DONE]`` stays a string."""
    events: list[Any] = []
    for block in text.split("\n\n"):
        if block.startswith("data: "):
            payload = block[len("data: ") :]
            events.append(payload if payload == "[DONE]" else orjson.loads(payload))
    return events


def test_chat_non_streaming(client: httpx.Client, upstream: FakeUpstream) -> None:
    r = client.post("/chat/completions", json=CHAT, headers={"Authorization": "Bearer k"})
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "chat.completion" and body["model"] == "m1"
    choice = body["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": "echo: hello there world"}
    assert choice["finish_reason"] == "stop"
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
    assert upstream.count() == 1
    seen = upstream.requests[0]
    assert seen.method == "POST" and seen.path == "/v1/chat/completions"
    assert seen.headers["authorization"] == "Bearer k" and seen.json == CHAT


def test_content_parts_and_echo_request(client: httpx.Client) -> None:
    parts = [{"type": "text", "text": "a "}, {"type": "image_url"}, {"type": "text", "text": "b"}]
    req = {"model": "m1", "messages": [{"role": "user", "content": parts}]}
    assert client.post("/chat/completions", json=req).json()["choices"][0]["message"][
        "content"
    ] == ("echo: a b")
    echoed = client.post("/chat/completions", json=req, headers={"X-Fake-Echo-Request": "1"})
    assert orjson.loads(echoed.json()["choices"][0]["message"]["content"]) == req["messages"]


@pytest.mark.parametrize("include_usage", [False, True])
def test_chat_streaming(client: httpx.Client, include_usage: bool) -> None:
    req: dict[str, Any] = {**CHAT, "stream": True}
    if include_usage:
        req["stream_options"] = {"include_usage": True}
    r = client.post("/chat/completions", json=req, headers={"X-Fake-Chunks": "5"})
    assert r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == "echo: hello there world"
    content_chunks = [
        c for c in chunks[1:] if c["choices"] and "content" in c["choices"][0]["delta"]
    ]
    assert len(content_chunks) == 5
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert finishes[-1] == "stop" and set(finishes[:-1]) == {None}
    if include_usage:
        assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] == 7
    else:
        assert all("usage" not in c for c in chunks)


def test_tool_calls(client: httpx.Client) -> None:
    req = {**CHAT, "tools": TOOLS}
    msg = client.post("/chat/completions", json=req).json()["choices"][0]
    assert msg["finish_reason"] == "tool_calls" and msg["message"]["content"] is None
    call = msg["message"]["tool_calls"][0]
    assert call["id"] == "call_0" and call["function"]["name"] == "move"
    assert orjson.loads(call["function"]["arguments"]) == {"direction": "fake"}

    parallel = client.post("/chat/completions", json=req, headers={"X-Fake-Parallel-Tools": "3"})
    calls = parallel.json()["choices"][0]["message"]["tool_calls"]
    assert [c["id"] for c in calls] == ["call_0", "call_1", "call_2"]

    after_tool = {**req, "messages": [*CHAT["messages"], {"role": "tool", "content": "ok"}]}
    answered = client.post("/chat/completions", json=after_tool).json()["choices"][0]
    assert answered["finish_reason"] == "stop" and answered["message"]["content"] == "echo: ok"


def test_tool_calls_streaming(client: httpx.Client) -> None:
    req = {**CHAT, "tools": TOOLS, "stream": True}
    r = client.post("/chat/completions", json=req, headers={"X-Fake-Parallel-Tools": "2"})
    chunks = sse_events(r.text)[:-1]
    calls: dict[int, dict[str, str]] = {}
    for c in chunks:
        for tc in c["choices"][0]["delta"].get("tool_calls", []):
            slot = calls.setdefault(tc["index"], {"name": "", "arguments": ""})
            slot["name"] += tc.get("function", {}).get("name", "")
            slot["arguments"] += tc.get("function", {}).get("arguments", "")
    assert calls == {
        0: {"name": "move", "arguments": '{"direction":"fake"}'},
        1: {"name": "look", "arguments": "{}"},
    }
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_faults(client: httpx.Client) -> None:
    r = client.post("/chat/completions", json=CHAT, headers={"X-Fake-Status": "429"})
    assert r.status_code == 429
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}

    retry = {"X-Fake-Fail-Times": "2", "X-Fake-Fail-Key": "k1", "X-Fake-Status": "503"}
    statuses = [
        client.post("/chat/completions", json=CHAT, headers=retry).status_code for _ in "abc"
    ]
    assert statuses == [503, 503, 200]

    broken = {**CHAT, "stream": True}
    with pytest.raises(httpx.HTTPError):
        client.post("/chat/completions", json=broken, headers={"X-Fake-Stream-Break-After": "2"})
    assert client.post("/chat/completions", content=b"{nope").status_code == 400


def test_other_endpoints(client: httpx.Client) -> None:
    assert [m["id"] for m in client.get("/models").json()["data"]] == ["m1", "m2"]
    text = client.post("/completions", json={"model": "m1", "prompt": "hi"}).json()
    assert text["object"] == "text_completion" and text["choices"][0]["text"] == "echo: hi"
    emb = client.post("/embeddings", json={"model": "e", "input": ["a", "b"]}).json()
    assert len(emb["data"]) == 2 and emb["data"][0]["embedding"] != emb["data"][1]["embedding"]
    resp = client.post("/responses", json={"model": "m1", "input": "yo"}).json()
    assert resp["object"] == "response" and resp["output"][0]["content"][0]["text"] == "echo: yo"
    missing = client.post("/nothing/here", json={})
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"


def test_help_lists_the_request_headers_that_steer_it(capsys: pytest.CaptureFixture[str]) -> None:
    from budgetproxy.testing.fake_upstream import main

    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    for header in ("X-Fake-Status", "X-Fake-Delay-Ms", "X-Fake-Stream-Break-After",
                   "X-Fake-Echo-Request"):
        assert header in out, header
    # through the proxy only when it is told to forward them (server.forward_headers)
    assert "the proxy forwards them" not in out
    assert 'forward_headers: ["x-fake-*"]' in out


def test_the_steering_headers_reach_it_through_the_proxy_only_when_forwarded(
    proxy: ProxyFactory,
) -> None:
    """What the help says: by default the proxy keeps X-Fake-* to itself; with
    server.forward_headers: ["x-fake-*"] they steer the fake."""
    plain = proxy({"server": {"forward_headers": []}}).http()
    told = proxy({"server": {"forward_headers": ["x-fake-*"]}}).http()
    body = {"model": "m1", "messages": [{"role": "user", "content": "hi"}]}
    steer = {"X-Fake-Status": "418"}
    assert plain.post("/v1/chat/completions", json=body, headers=steer).status_code == 200
    assert told.post("/v1/chat/completions", json=body, headers=steer).status_code == 418
