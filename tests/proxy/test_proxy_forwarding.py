"""Proxy core, through the official openai client against the real server: what passes through."""

from __future__ import annotations

import time
from typing import Any

import httpx
import orjson
import pytest
from conftest import Proxy, ProxyFactory, WatchedUpstream, chat_body, new_id

from budgetproxy.testing import FakeUpstream

TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "move",
            "description": "Move one step.",
            "parameters": {
                "type": "object",
                "properties": {"direction": {"type": "string"}, "steps": {"type": "integer"}},
                "required": ["direction"],
            },
        },
    },
    {"type": "function", "function": {"name": "look", "parameters": {"type": "object"}}},
]


@pytest.fixture(scope="module")
def routed(proxy: ProxyFactory, upstream: FakeUpstream, upstream2: FakeUpstream) -> Proxy:
    """Three upstreams: m* → main (key A), other-*/gpt-? → second (key B), * → main (key C)."""
    return proxy(
        {
            "upstreams": [
                {"name": "a", "base_url": upstream.base_url, "api_key": "sk-upstream-A",
                 "models": ["m*"]},
                {"name": "b", "base_url": upstream2.base_url, "api_key": "sk-upstream-B",
                 "models": ["other-*", "gpt-?"]},
                {"name": "c", "base_url": upstream.base_url, "api_key": "sk-upstream-C",
                 "models": ["*"]},
            ]
        }
    )


def test_chat_non_streaming(default_proxy: Proxy, upstream: FakeUpstream) -> None:
    eid = new_id()
    client = default_proxy.client()
    raw = client.chat.completions.with_raw_response.create(
        model="m1", messages=[{"role": "user", "content": "hello proxy"}],
        extra_headers={"X-Episode-Id": eid},
    )
    reply = raw.parse()
    assert reply.choices[0].message.content == "echo: hello proxy"
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage is not None and reply.usage.total_tokens == 5
    assert raw.headers["x-episode-id"] == eid
    assert raw.headers["x-episode-turn"] == "1"
    seen = upstream.requests[-1]
    assert seen.path == "/v1/chat/completions"
    assert seen.json == {"model": "m1", "messages": [{"role": "user", "content": "hello proxy"}]}
    assert not any(k.startswith("x-episode") for k in seen.headers)


def test_chat_without_episode_is_forwarded_uncounted(default_proxy: Proxy) -> None:
    raw = default_proxy.client().chat.completions.with_raw_response.create(
        model="m1", messages=[{"role": "user", "content": "no episode"}]
    )
    assert raw.parse().choices[0].message.content == "echo: no episode"
    assert "x-episode-id" not in raw.headers


def test_streaming_arrives_incrementally(default_proxy: Proxy) -> None:
    client = default_proxy.client()
    t0 = time.monotonic()
    stream = client.chat.completions.create(
        model="m1", messages=[{"role": "user", "content": "one two three four five"}],
        stream=True,
        extra_headers={"X-Episode-Id": new_id(), "X-Fake-Chunks": "5",
                       "X-Fake-Chunk-Gap-Ms": "250"},
    )
    arrivals: list[float] = []
    pieces: list[str] = []
    finish = None
    for chunk in stream:
        arrivals.append(time.monotonic() - t0)
        if chunk.choices:
            pieces.append(chunk.choices[0].delta.content or "")
            finish = chunk.choices[0].finish_reason or finish
    assert "".join(pieces) == "echo: one two three four five"
    assert finish == "stop"
    # 5 gaps of 250 ms upstream: the first chunk must not wait for the last.
    assert arrivals[-1] - arrivals[0] > 1.0, arrivals
    assert arrivals[0] < arrivals[-1] / 2, arrivals


@pytest.mark.parametrize("stream", [False, True])
def test_tools_and_parallel_tool_calls_pass_through(
    default_proxy: Proxy, upstream: FakeUpstream, stream: bool
) -> None:
    client = default_proxy.client()
    headers = {"X-Episode-Id": new_id(), "X-Fake-Parallel-Tools": "3"}
    msgs: Any = [{"role": "user", "content": "go"}]
    if not stream:
        reply = client.chat.completions.create(
            model="m1", messages=msgs, tools=TOOLS, tool_choice="auto",
            parallel_tool_calls=True, extra_headers=headers,
        )
        message = reply.choices[0].message
        finish = reply.choices[0].finish_reason
        calls = [(c.id, c.function.name, c.function.arguments) for c in message.tool_calls or []]
    else:
        slots: dict[int, list[str]] = {}
        finish = None
        for chunk in client.chat.completions.create(
            model="m1", messages=msgs, tools=TOOLS, stream=True, extra_headers=headers,
        ):
            if not chunk.choices:
                continue
            finish = chunk.choices[0].finish_reason or finish
            for tc in chunk.choices[0].delta.tool_calls or []:
                slot = slots.setdefault(tc.index, ["", "", ""])
                slot[0] += tc.id or ""
                if tc.function is not None:
                    slot[1] += tc.function.name or ""
                    slot[2] += tc.function.arguments or ""
        calls = [tuple(slots[i]) for i in sorted(slots)]  # type: ignore[misc]
    assert finish == "tool_calls"
    assert calls == [
        ("call_0", "move", '{"direction":"fake","steps":1}'),
        ("call_1", "look", "{}"),
        ("call_2", "move", '{"direction":"fake","steps":1}'),
    ]
    assert upstream.requests[-1].json["tools"] == TOOLS
    # A tool result goes back through as it was sent.
    follow = [
        *msgs,
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_0", "type": "function",
             "function": {"name": "move", "arguments": '{"direction":"fake"}'}}]},
        {"role": "tool", "tool_call_id": "call_0", "content": "moved"},
    ]
    reply2 = client.chat.completions.create(model="m1", messages=follow, tools=TOOLS,
                                            extra_headers=headers)
    assert reply2.choices[0].message.content == "echo: moved"
    assert upstream.requests[-1].json["messages"] == follow


def test_every_request_field_passes_through(default_proxy: Proxy, upstream: FakeUpstream) -> None:
    client = default_proxy.client()
    client.chat.completions.create(
        model="m1",
        messages=[
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hi"},
                                         {"type": "image_url",
                                          "image_url": {"url": "data:image/png;base64,AAAA"}}]},
        ],
        temperature=0.3, top_p=0.9, max_tokens=17, stop=["\n\n"], seed=42, n=1,
        presence_penalty=0.1, frequency_penalty=0.2, logit_bias={"50256": -100},
        response_format={"type": "json_object"}, user="agent-7", logprobs=True, top_logprobs=2,
        tools=TOOLS, tool_choice={"type": "function", "function": {"name": "look"}},
        extra_body={"custom_field": {"nested": [1, 2.5, None, "x"]}, "repetition_penalty": 1.1},
        extra_headers={"X-Episode-Id": new_id(), "X-Custom-Header": "kept"},
    )
    seen = upstream.requests[-1]
    assert seen.json == {
        "model": "m1",
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hi"},
                                         {"type": "image_url",
                                          "image_url": {"url": "data:image/png;base64,AAAA"}}]},
        ],
        "temperature": 0.3, "top_p": 0.9, "max_tokens": 17, "stop": ["\n\n"], "seed": 42, "n": 1,
        "presence_penalty": 0.1, "frequency_penalty": 0.2, "logit_bias": {"50256": -100},
        "response_format": {"type": "json_object"}, "user": "agent-7", "logprobs": True,
        "top_logprobs": 2, "tools": TOOLS,
        "tool_choice": {"type": "function", "function": {"name": "look"}},
        "custom_field": {"nested": [1, 2.5, None, "x"]}, "repetition_penalty": 1.1,
    }
    # headers are forwarded by name (core/forwarded_headers.py): an unknown one is not
    assert "x-custom-header" not in seen.headers


def test_hidden_body_bytes_are_untouched(default_proxy: Proxy, upstream: FakeUpstream) -> None:
    # Odd spacing, key order and unicode escapes: forwarded byte for byte.
    body = (b'{ "messages":[{"content":"caf\\u00e9  \xe2\x9c\x93","role":"user"}],'
            b'   "model":"m1","temperature":1.0e0 }')
    with default_proxy.http() as http:
        r = http.post("/v1/chat/completions", content=body,
                      headers={"content-type": "application/json", "X-Episode-Id": new_id()})
    assert r.status_code == 200
    assert upstream.requests[-1].body == body


@pytest.mark.parametrize("stream", [False, True])
def test_text_completions(default_proxy: Proxy, stream: bool) -> None:
    client = default_proxy.client()
    eid = new_id()
    if stream:
        text = "".join(
            c.choices[0].text for c in client.completions.create(
                model="m1", prompt="say it", stream=True, extra_headers={"X-Episode-Id": eid})
            if c.choices
        )
    else:
        text = client.completions.create(model="m1", prompt="say it",
                                         extra_headers={"X-Episode-Id": eid}).choices[0].text
    assert text == "echo: say it"
    assert default_proxy.episode(eid)["turns_used"] == 1


def test_models_are_merged_over_upstreams(routed: Proxy) -> None:
    ids = [m.id for m in routed.client().models.list().data]
    assert sorted(ids) == ["m1", "m2", "other-1", "shared"]


def test_other_v1_paths_pass_through_uncounted(
    routed: Proxy, upstream: FakeUpstream, upstream2: FakeUpstream
) -> None:
    eid = new_id()
    client = routed.client()
    emb = client.embeddings.create(model="m1", input=["a b", "c"],
                                   extra_headers={"X-Episode-Id": eid})
    assert len(emb.data) == 2 and len(emb.data[0].embedding) == 8
    assert upstream.requests[-1].path == "/v1/embeddings"
    assert upstream.requests[-1].headers["authorization"] == "Bearer sk-upstream-A"
    emb2 = client.embeddings.create(model="other-1", input="x")
    assert len(emb2.data) == 1
    assert upstream2.requests[-1].path == "/v1/embeddings"
    assert upstream2.requests[-1].headers["authorization"] == "Bearer sk-upstream-B"
    r = httpx.get(f"{routed.url}/v1/episodes/{eid}")
    assert r.status_code == 404  # embeddings never create or spend an episode


@pytest.mark.parametrize(
    ("model", "which", "key"),
    [
        ("m2", "main", "sk-upstream-A"),
        ("other-1", "second", "sk-upstream-B"),
        ("gpt-4", "second", "sk-upstream-B"),
        ("gpt-40", "main", "sk-upstream-C"),
        ("zzz", "main", "sk-upstream-C"),
    ],
)
def test_routing_by_model_and_upstream_key_replaces_the_client_one(
    routed: Proxy, upstream: FakeUpstream, upstream2: FakeUpstream, model: str, which: str,
    key: str,
) -> None:
    target = upstream if which == "main" else upstream2
    before = len(target.requests)
    client = routed.client(api_key="sk-client-secret-0000",
                           default_headers={"x-api-key": "sk-client-other"})
    reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "r"}],
                                           extra_headers={"X-Episode-Id": new_id()})
    assert reply.model == model
    assert len(target.requests) == before + 1
    seen = target.requests[-1]
    assert seen.headers["authorization"] == f"Bearer {key}"
    assert "sk-client" not in orjson.dumps(seen.headers).decode()


def test_client_key_forwarded_when_no_upstream_key(
    default_proxy: Proxy, upstream: FakeUpstream
) -> None:
    default_proxy.client(api_key="sk-passed-through").chat.completions.create(
        model="m1", messages=[{"role": "user", "content": "k"}])
    assert upstream.requests[-1].headers["authorization"] == "Bearer sk-passed-through"


@pytest.mark.parametrize("kind", ["chat", "completions"])
def test_stream_usage_is_injected_and_its_chunk_dropped(
    default_proxy: Proxy, upstream: FakeUpstream, kind: str
) -> None:
    client = default_proxy.client()
    eid = new_id()
    if kind == "chat":
        chunks = list(client.chat.completions.create(
            model="m1", messages=[{"role": "user", "content": "count my tokens"}], stream=True,
            extra_headers={"X-Episode-Id": eid}))
    else:
        chunks = list(client.completions.create(
            model="m1", prompt="count my tokens", stream=True,
            extra_headers={"X-Episode-Id": eid}))
    assert upstream.requests[-1].json["stream_options"] == {"include_usage": True}
    assert all(c.usage is None for c in chunks)
    assert all(c.choices for c in chunks)
    # ... while the proxy still read the usage for its own record.
    rec = default_proxy.wait_records(type="turn", episode_id=eid)
    assert rec and rec[0]["usage"]["prompt_tokens"] == 3


def test_stream_usage_kept_when_the_client_asked(
    default_proxy: Proxy, upstream: FakeUpstream
) -> None:
    body = chat_body("usage please", stream=True, stream_options={"include_usage": True})
    raw = orjson.dumps(body)
    with default_proxy.http() as http:
        r = http.post("/v1/chat/completions", content=raw,
                      headers={"content-type": "application/json", "X-Episode-Id": new_id()})
    assert upstream.requests[-1].body == raw  # nothing to inject: untouched
    events = [ln[6:] for ln in r.text.split("\n") if ln.startswith("data: ")]
    assert events[-1] == "[DONE]"
    last = orjson.loads(events[-2])
    assert last["choices"] == [] and last["usage"]["prompt_tokens"] == 2


def test_stream_usage_is_added_to_the_body_as_sent(
    default_proxy: Proxy, upstream: FakeUpstream
) -> None:
    """The hidden arm's one change to a body: the rest keeps its bytes (spacing, key order,
    an integer past 64 bits that re-encoding would have to guard)."""
    raw = (b'{ "seed": 123456789012345678901234567890, "model": "m1", "stream": true,\n'
           b'  "messages": [{"role": "user", "content": "as sent"}] }\n')
    with default_proxy.http() as http:
        r = http.post("/v1/chat/completions", content=raw,
                      headers={"content-type": "application/json", "X-Episode-Id": new_id()})
    assert r.status_code == 200 and "[DONE]" in r.text
    assert upstream.requests[-1].body == (
        raw[:-2] + b',"stream_options":{"include_usage":true}}\n')


def test_stream_usage_injection_can_be_switched_off(
    proxy: ProxyFactory, upstream: FakeUpstream
) -> None:
    p = proxy({"upstreams": [{"name": "plain", "base_url": upstream.base_url,
                              "inject_stream_usage": False}]})
    list(p.client().chat.completions.create(model="m1", stream=True,
                                            messages=[{"role": "user", "content": "x"}]))
    assert "stream_options" not in upstream.requests[-1].json


def test_health_and_readiness(default_proxy: Proxy) -> None:
    assert httpx.get(f"{default_proxy.url}/healthz").status_code == 200
    assert httpx.get(f"{default_proxy.url}/readyz").status_code == 200


def test_upstream_stream_ending_is_seen_by_the_fake(
    default_proxy: Proxy, upstream: WatchedUpstream
) -> None:
    """Sanity check for the disconnect test: a normal stream ends as "done" upstream."""
    before = len(upstream.stream_ends)
    list(default_proxy.client().chat.completions.create(
        model="m1", messages=[{"role": "user", "content": "x"}], stream=True))
    deadline = time.monotonic() + 3
    while len(upstream.stream_ends) == before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert upstream.stream_ends[-1][0] == "done"


def test_responses_calls_are_turns_and_count_tokens_passes_through(
    default_proxy: Proxy, upstream: FakeUpstream
) -> None:
    eid = new_id()
    client = default_proxy.client(default_headers={"X-Episode-Id": eid})
    resp = client.responses.create(model="m1", input="hi there")
    assert resp.output_text == "echo: hi there"
    assert upstream.requests[-1].path == "/v1/responses"
    assert default_proxy.episode(eid)["turns_used"] == 1
    r = default_proxy.http().post("/v1/messages/count_tokens", headers={"X-Episode-Id": eid},
                                  json={"model": "m1", "messages": [{"role": "user",
                                                                     "content": "x"}]})
    assert upstream.requests[-1].path == "/v1/messages/count_tokens"
    assert (r.status_code, r.json()) == (200, {"input_tokens": 1})  # the fake's own answer
    assert default_proxy.episode(eid)["turns_used"] == 1
