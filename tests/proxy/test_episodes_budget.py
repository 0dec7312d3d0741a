"""Turns and budgets: headers, reject and finish modes, refunds, retries, concurrency."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai
import orjson
import pytest
from conftest import (
    Proxy,
    ProxyFactory,
    assert_openai_error,
    chat_body,
    free_port,
    new_id,
)
from redis_support import REDIS_URL, drop_prefix, new_prefix, require_redis

from budgetproxy.testing import FakeUpstream


def call(p: Proxy, eid: str, body: Any = None, **headers: str) -> httpx.Response:
    raw = body if isinstance(body, bytes) else orjson.dumps(body or chat_body())
    with p.http() as http:
        return http.post("/v1/chat/completions", content=raw,
                         headers={"content-type": "application/json", "X-Episode-Id": eid,
                                  **headers})


def seen_upstream(up: FakeUpstream, marker: str) -> int:
    return sum(1 for r in list(up.requests) if marker.encode() in r.body)


# -- headers --------------------------------------------------------------------------------


def test_budget_headers_on_every_response(default_proxy: Proxy) -> None:
    eid = new_id()
    for turn in range(1, 4):
        r = call(default_proxy, eid, chat_body(f"turn {turn}"), **{"X-Episode-Budget": "3"})
        assert r.status_code == 200
        assert (r.headers["x-episode-id"], r.headers["x-episode-turn"],
                r.headers["x-episode-budget"], r.headers["x-episode-remaining"]) == (
            eid, str(turn), "3", str(3 - turn))
    r = call(default_proxy, eid, chat_body("over"))
    assert r.status_code == 403
    assert r.headers["x-episode-id"] == eid
    assert r.headers["x-episode-budget"] == "3" and r.headers["x-episode-remaining"] == "0"


def test_budget_headers_on_streams_and_upstream_errors(default_proxy: Proxy) -> None:
    eid = new_id()
    r = call(default_proxy, eid, chat_body("s", stream=True), **{"X-Episode-Budget": "4"})
    assert r.status_code == 200 and r.headers["x-episode-remaining"] == "3"
    r = call(default_proxy, eid, chat_body("bad"), **{"X-Fake-Status": "400"})
    assert r.status_code == 400 and r.headers["x-episode-turn"] == "2"
    assert r.headers["x-episode-remaining"] == "2"  # a 4xx is charged
    r = call(default_proxy, eid, chat_body("boom"), **{"X-Fake-Status": "500"})
    assert r.status_code == 500 and r.headers["x-episode-remaining"] == "2"  # refunded


@pytest.mark.parametrize(
    ("mode", "arm", "shown"),
    [("always", "hidden", True), ("always", "disclosed", True),
     ("disclosed_only", "hidden", False), ("disclosed_only", "disclosed", True),
     ("never", "hidden", False), ("never", "disclosed", False)],
)
def test_budget_headers_modes(proxy: ProxyFactory, mode: str, arm: str, shown: bool) -> None:
    p = proxy({"episodes": {"budget_headers": mode}})
    eid = new_id()
    r = call(p, eid, **{"X-Episode-Disclosure": arm, "X-Episode-Budget": "1"})
    assert r.headers["x-episode-id"] == eid and r.headers["x-episode-turn"] == "1"
    assert ("x-episode-budget" in r.headers) is shown
    assert ("x-episode-remaining" in r.headers) is shown
    r = call(p, eid, chat_body("again"))
    assert r.status_code == 403 and ("x-episode-budget" in r.headers) is shown


# -- spent budget ---------------------------------------------------------------------------


def test_reject_mode(default_proxy: Proxy, upstream: FakeUpstream) -> None:
    eid = new_id()
    for i in range(2):
        assert call(default_proxy, eid, chat_body(f"t{i}"), **{"X-Episode-Budget": "2"}
                    ).status_code == 200
    before = len(upstream.requests)
    r = call(default_proxy, eid, chat_body("t2", stream=True))
    assert r.status_code == 403
    assert r.headers["x-should-retry"] == "false"
    err = r.json()["error"]
    assert set(r.json()) == {"error"}
    assert set(err) == {"message", "type", "param", "code"}
    assert (err["type"], err["param"], err["code"]) == (
        "budget_exhausted", None, "turn_budget_exhausted")
    assert isinstance(err["message"], str) and err["message"]
    # The SDK, with retries on, neither retries nor mistakes it for a rate limit.
    client = default_proxy.client(max_retries=3, default_headers={"X-Episode-Id": eid})
    with pytest.raises(openai.PermissionDeniedError) as info:
        client.chat.completions.create(model="m1", messages=[{"role": "user", "content": "x"}])
    assert info.value.code == "turn_budget_exhausted"
    assert len(upstream.requests) == before
    # One refused call each (the SDK did not retry), each logged as "rejected".
    rejected = default_proxy.wait_records(2, type="turn", episode_id=eid, status="rejected")
    time.sleep(0.2)
    assert len(default_proxy.records(type="turn", episode_id=eid, status="rejected")) == 2
    assert {r["http_status"] for r in rejected} == {403}
    ep = default_proxy.episode(eid)
    assert ep["exhausted"] is True and ep["turns_used"] == 2 and ep["status"] == "active"


@pytest.fixture(scope="module")
def finishing(proxy: ProxyFactory) -> Proxy:
    return proxy({"budget": {"on_exhausted": "finish", "finish_reason": "stop"}})


def spend(p: Proxy, eid: str, budget: int = 1) -> None:
    for i in range(budget):
        assert call(p, eid, chat_body(f"spend {i}"), **{"X-Episode-Budget": str(budget)}
                    ).status_code == 200


def test_finish_mode_non_streaming(finishing: Proxy, upstream: FakeUpstream) -> None:
    eid = new_id()
    spend(finishing, eid)
    before = len(upstream.requests)
    client = finishing.client(default_headers={"X-Episode-Id": eid})
    raw = client.chat.completions.with_raw_response.create(
        model="m1", messages=[{"role": "user", "content": "more"}],
        tools=[{"type": "function", "function": {"name": "move", "parameters": {}}}])
    assert raw.http_response.status_code == 200
    assert raw.headers["x-episode-exhausted"] == "true"
    assert raw.headers["x-episode-remaining"] == "0"
    reply = raw.parse()
    choice = reply.choices[0]
    assert choice.finish_reason == "stop"
    assert choice.message.role == "assistant" and choice.message.content
    assert not choice.message.tool_calls
    assert reply.model == "m1"
    assert len(upstream.requests) == before


@pytest.mark.parametrize("usage", [False, True])
def test_finish_mode_streaming(finishing: Proxy, upstream: FakeUpstream, usage: bool) -> None:
    eid = new_id()
    spend(finishing, eid)
    before = len(upstream.requests)
    client = finishing.client(default_headers={"X-Episode-Id": eid})
    extra: dict[str, Any] = {"stream_options": {"include_usage": True}} if usage else {}
    with client.chat.completions.with_streaming_response.create(
        model="m1", messages=[{"role": "user", "content": "more"}], stream=True, **extra
    ) as raw:
        assert raw.headers["x-episode-exhausted"] == "true"
        assert raw.headers["content-type"].startswith("text/event-stream")
        chunks = list(raw.parse())
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert text and finishes[-1] == "stop"
    assert not any(c.choices[0].delta.tool_calls for c in chunks if c.choices)
    assert any(c.usage is not None for c in chunks) is usage
    assert len(upstream.requests) == before


def test_finish_mode_default_finish_reason_and_completions(
    proxy: ProxyFactory, upstream: FakeUpstream
) -> None:
    p = proxy({"budget": {"on_exhausted": "finish", "finish_replies": 2}})
    eid = new_id()
    spend(p, eid)
    before = len(upstream.requests)
    client = p.client(default_headers={"X-Episode-Id": eid})
    reply = client.chat.completions.create(model="m1", messages=[{"role": "user", "content": "x"}])
    assert reply.choices[0].finish_reason == "length"
    done = client.completions.create(model="m1", prompt="x")
    assert done.choices[0].finish_reason == "length"
    assert len(upstream.requests) == before
    assert p.episode(eid)["exhausted"] is True


# -- refunds --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def failing(proxy: ProxyFactory, upstream: FakeUpstream) -> Proxy:
    return proxy({"upstreams": [
        {"name": "dead", "base_url": f"http://127.0.0.1:{free_port()}/v1", "models": ["dead-*"]},
        {"name": "slow", "base_url": upstream.base_url, "models": ["slow-*"], "timeout_s": 0.4},
        {"name": "main", "base_url": upstream.base_url},
    ]})


@pytest.mark.parametrize(
    ("model", "headers", "status", "refunded"),
    [
        ("m1", {"X-Fake-Status": "500"}, 500, True),
        ("m1", {"X-Fake-Status": "503"}, 503, True),
        ("m1", {"X-Fake-Status": "429"}, 429, True),
        ("dead-1", {}, 502, True),
        ("slow-1", {"X-Fake-Delay-Ms": "1500"}, 504, True),
        ("m1", {"X-Fake-Status": "400"}, 400, False),
        ("m1", {"X-Fake-Status": "404"}, 404, False),
        ("m1", {"X-Fake-Status": "422"}, 422, False),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
def test_refunds(
    failing: Proxy, model: str, headers: dict[str, str], status: int, refunded: bool,
    stream: bool,
) -> None:
    eid = new_id()
    r = call(failing, eid, chat_body("fail", model=model, stream=stream),
             **{"X-Episode-Budget": "3", **headers})
    assert r.status_code == status
    assert r.headers["x-episode-remaining"] == ("3" if refunded else "2")
    assert failing.episode(eid)["turns_used"] == (0 if refunded else 1)


def test_refund_lets_the_turn_be_spent_again(failing: Proxy, upstream: FakeUpstream) -> None:
    eid = new_id()
    for i in range(3):
        assert call(failing, eid, chat_body(f"f{i}"),
                    **{"X-Episode-Budget": "1", "X-Fake-Status": "500"}).status_code == 500
    r = call(failing, eid, chat_body("works"))
    assert r.status_code == 200 and r.headers["x-episode-turn"] == "1"
    assert call(failing, eid, chat_body("over")).status_code == 403


def test_stream_broken_after_bytes_is_charged(failing: Proxy) -> None:
    eid = new_id()
    r = call(failing, eid, chat_body("a long answer here", stream=True),
             **{"X-Episode-Budget": "3", "X-Fake-Stream-Break-After": "2", "X-Fake-Chunks": "6"})
    assert r.status_code == 200
    assert r.text.startswith("data: ") and "[DONE]" not in r.text
    assert failing.episode(eid)["turns_used"] == 1
    rec = failing.wait_records(type="turn", episode_id=eid)
    assert rec and rec[0]["status"] == "upstream_error" and rec[0]["remaining"] == 2


def test_stream_broken_before_any_byte_is_refunded(failing: Proxy) -> None:
    eid = new_id()
    r = call(failing, eid, chat_body("x", stream=True),
             **{"X-Episode-Budget": "3", "X-Fake-Stream-Break-After": "0"})
    assert r.status_code == 502
    assert failing.episode(eid)["turns_used"] == 0


def test_count_failed_turns(proxy: ProxyFactory, upstream: FakeUpstream) -> None:
    p = proxy({"budget": {"count_failed_turns": True}, "upstreams": [
        {"name": "dead", "base_url": f"http://127.0.0.1:{free_port()}/v1", "models": ["dead-*"]},
        {"name": "main", "base_url": upstream.base_url}]})
    eid = new_id()
    r = call(p, eid, chat_body("x"), **{"X-Episode-Budget": "3", "X-Fake-Status": "500"})
    assert r.status_code == 500 and r.headers["x-episode-remaining"] == "2"
    assert call(p, eid, chat_body("y"), **{"X-Fake-Status": "429"}).status_code == 429
    assert call(p, eid, chat_body("z", model="dead-1")).status_code == 502
    assert p.episode(eid)["turns_used"] == 3
    assert call(p, eid, chat_body("w")).status_code == 403


# -- retries --------------------------------------------------------------------------------


def test_identical_resend_after_charged_turn_is_free_then_a_new_turn(
    default_proxy: Proxy, upstream: FakeUpstream
) -> None:
    eid = new_id()
    marker = new_id("retry")
    body = orjson.dumps(chat_body(marker))
    turns = []
    for _ in range(4):
        r = call(default_proxy, eid, body, **{"X-Episode-Budget": "5"})
        assert r.status_code == 200
        turns.append((r.headers["x-episode-turn"], r.headers["x-episode-remaining"]))
    # free_retries_per_turn = 2: attempts 2 and 3 are free, the 4th send is turn 2.
    assert turns == [("1", "4"), ("1", "4"), ("1", "4"), ("2", "3")]
    assert seen_upstream(upstream, marker) == 4  # retries are forwarded, just not charged
    recs = default_proxy.wait_records(4, type="turn", episode_id=eid)
    assert [(r["turn"], r["attempt"]) for r in recs] == [(1, 1), (1, 2), (1, 3), (2, 1)]
    assert default_proxy.episode(eid)["turns_used"] == 2


def test_free_retries_per_turn_is_configurable(proxy: ProxyFactory) -> None:
    p = proxy({"budget": {"free_retries_per_turn": 0}})
    eid = new_id()
    body = orjson.dumps(chat_body("same"))
    assert [call(p, eid, body).headers["x-episode-turn"] for _ in range(3)] == ["1", "2", "3"]


def test_identical_resend_after_refunded_turn_is_charged_as_that_turn(
    default_proxy: Proxy,
) -> None:
    eid = new_id()
    body = orjson.dumps(chat_body("flaky"))
    r = call(default_proxy, eid, body, **{"X-Episode-Budget": "5", "X-Fake-Status": "503"})
    assert r.status_code == 503 and r.headers["x-episode-remaining"] == "5"
    r = call(default_proxy, eid, body)
    assert r.status_code == 200
    assert (r.headers["x-episode-turn"], r.headers["x-episode-remaining"]) == ("1", "4")
    recs = default_proxy.wait_records(2, type="turn", episode_id=eid)
    assert [(r["turn"], r["attempt"], r["status"]) for r in recs] == [
        (1, 1, "upstream_error"), (1, 2, "ok")]
    assert default_proxy.episode(eid)["turns_used"] == 1


def test_sdk_retries_of_a_5xx_spend_one_turn(default_proxy: Proxy, upstream: FakeUpstream) -> None:
    eid = new_id()
    key = new_id("fail")
    client = default_proxy.client(max_retries=3, default_headers={"X-Episode-Id": eid})
    reply = client.chat.completions.create(
        model="m1", messages=[{"role": "user", "content": key}],
        extra_headers={"X-Fake-Fail-Times": "2", "X-Fake-Fail-Key": key, "X-Fake-Status": "500"})
    assert reply.choices[0].message.content == f"echo: {key}"
    assert seen_upstream(upstream, key) == 3
    assert default_proxy.episode(eid)["turns_used"] == 1


def test_retry_headers_never_make_a_different_body_free(default_proxy: Proxy) -> None:
    eid = new_id()
    r1 = call(default_proxy, eid, chat_body("first"), **{"X-Episode-Budget": "5"})
    r2 = call(default_proxy, eid, chat_body("second"),
              **{"x-stainless-retry-count": "1", "Idempotency-Key": "stainless-retry-abc"})
    assert (r1.headers["x-episode-turn"], r2.headers["x-episode-turn"]) == ("1", "2")
    assert default_proxy.episode(eid)["turns_used"] == 2


def test_identical_body_after_another_turn_is_a_new_turn(default_proxy: Proxy) -> None:
    eid = new_id()
    a, b = orjson.dumps(chat_body("a")), orjson.dumps(chat_body("b"))
    assert [call(default_proxy, eid, x).headers["x-episode-turn"] for x in (a, b, a)] == [
        "1", "2", "3"]


# -- concurrency ----------------------------------------------------------------------------


def test_parallel_calls_forward_exactly_the_turns_left(
    default_proxy: Proxy, upstream: FakeUpstream
) -> None:
    eid = new_id()
    for i in range(3):
        call(default_proxy, eid, chat_body(f"warmup {i}"), **{"X-Episode-Budget": "10"})
    marker = new_id("par")
    client = default_proxy.client(default_headers={"X-Episode-Id": eid})

    def one(i: int) -> int:
        try:
            client.chat.completions.create(
                model="m1", messages=[{"role": "user", "content": f"{marker} {i}"}],
                extra_headers={"X-Fake-Delay-Ms": "200"})
            return 200
        except openai.PermissionDeniedError as e:
            assert e.code == "turn_budget_exhausted"
            return 403

    with ThreadPoolExecutor(40) as pool:
        statuses = list(pool.map(one, range(40)))
    assert statuses.count(200) == 7 and statuses.count(403) == 33
    assert seen_upstream(upstream, marker) == 7
    ep = default_proxy.episode(eid)
    assert ep["turns_used"] == 10 and ep["remaining"] == 0


async def test_parallel_async_calls_forward_exactly_the_turns_left(
    default_proxy: Proxy, upstream: FakeUpstream
) -> None:
    eid = new_id()
    marker = new_id("apar")
    async with default_proxy.async_client(default_headers={"X-Episode-Id": eid,
                                                           "X-Episode-Budget": "7"}) as client:

        async def one(i: int) -> int:
            try:
                await client.chat.completions.create(
                    model="m1", messages=[{"role": "user", "content": f"{marker} {i}"}],
                    stream=i % 2 == 0, extra_headers={"X-Fake-Delay-Ms": "100"})
                return 200
            except openai.PermissionDeniedError:
                return 403

        statuses = await asyncio.gather(*(one(i) for i in range(40)))
    assert statuses.count(200) == 7
    assert seen_upstream(upstream, marker) == 7


# -- uncounted models -----------------------------------------------------------------------


def test_uncounted_models_never_spend_turns(proxy: ProxyFactory, upstream: FakeUpstream) -> None:
    p = proxy({"episodes": {"uncounted_models": ["judge-*", "embed?"]}})
    eid = new_id()
    assert call(p, eid, chat_body("counted"), **{"X-Episode-Budget": "1"}).status_code == 200
    for model in ("judge-small", "judge-large", "embedx"):
        r = call(p, eid, chat_body("free", model=model))
        assert r.status_code == 200, r.text
        assert r.json()["model"] == model
    assert call(p, eid, chat_body("counted again")).status_code == 403
    ep = p.episode(eid)
    assert ep["turns_used"] == 1
    # An uncounted call does not create an episode either.
    other = new_id()
    assert call(p, other, chat_body("x", model="judge-1")).status_code == 200
    with p.http() as http:
        assert http.get(f"/v1/episodes/{other}").status_code == 404


def test_unknown_episode_ids_with_errors_do_not_create(default_proxy: Proxy) -> None:
    eid = new_id()
    assert_openai_error(call(default_proxy, eid, b"{bad json"), 400, "invalid_request")
    with default_proxy.http() as http:
        assert http.get(f"/v1/episodes/{eid}").status_code == 404


# -- ending an episode with a turn in flight --------------------------------------------------


@pytest.fixture(scope="module", params=["memory", "redis"])
def either_store(request: pytest.FixtureRequest, proxy: ProxyFactory) -> Iterator[Proxy]:
    """A proxy on each store kind: both settle an ending the same way."""
    if request.param == "memory":
        yield proxy({})
        return
    require_redis()
    prefix = new_prefix()
    yield proxy({"store": {"kind": "redis", "url": REDIS_URL, "key_prefix": prefix}})
    drop_prefix(prefix)


@pytest.mark.parametrize(
    ("report", "fails", "expected"),
    [
        # the in-flight turn is refunded: 1 of 2 turns used, so not exhausted
        (None, True, {"end_reason": "abandoned", "turns_used": 1, "exhausted": False}),
        ({"success": False}, True,
         {"end_reason": "failure", "turns_used": 1, "exhausted": False}),
        ({"success": True}, True,
         {"end_reason": "success", "turns_used": 1, "success_turn": 1, "exhausted": False}),
        ({"success": True, "success_turn": 2}, True,
         {"end_reason": "success", "turns_used": 1, "success_turn": 1, "exhausted": False}),
        # the in-flight turn is answered: both turns used
        ({"success": False}, False,
         {"end_reason": "exhausted", "turns_used": 2, "exhausted": True}),
        ({"success": True}, False,
         {"end_reason": "success", "turns_used": 2, "success_turn": 2, "exhausted": True}),
    ],
)
def test_ending_with_a_turn_in_flight_settles_that_turn_first(
    either_store: Proxy, upstream: FakeUpstream, report: dict[str, Any] | None, fails: bool,
    expected: dict[str, Any],
) -> None:
    """The end reason follows the contract's precedence on the settled numbers: a turn in
    flight when the episode ends may still be refunded, and the episode is recorded once it
    has settled, with the same numbers its view shows."""
    p, eid = either_store, new_id("inflight")
    assert call(p, eid, chat_body("first"), **{"X-Episode-Budget": "2"}).status_code == 200
    marker = f"slow-{eid}"
    slow_headers = {"X-Fake-Delay-Ms": "600", **({"X-Fake-Status": "500"} if fails else {})}
    with ThreadPoolExecutor(1) as pool:
        slow = pool.submit(call, p, eid, chat_body(marker), **slow_headers)
        deadline = time.monotonic() + 5
        while not seen_upstream(upstream, marker) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert seen_upstream(upstream, marker), "the second turn never reached the upstream"
        if report is None:
            ended = p.http().post(f"/v1/episodes/{eid}/end")
        else:
            ended = p.http().post(f"/v1/episodes/{eid}/outcome", json=report)
        assert ended.status_code == 200 and ended.json()["status"] == "finished"
        assert ended.json()["settling"] is True  # its numbers may still change
        assert p.records(type="episode", episode_id=eid) == []  # not before the turn settles
        assert slow.result().status_code == (500 if fails else 200)
    records = p.wait_records(type="episode", episode_id=eid)
    assert len(records) == 1
    view = p.episode(eid)
    assert view["settling"] is False
    for key, value in expected.items():
        assert (records[0][key], view[key]) == (value, value), key
    turns = p.wait_records(2, type="turn", episode_id=eid)
    assert [t["charged"] for t in turns] == [True, not fails]
    # a second identical report changes nothing and records nothing more
    if report is not None:
        assert p.http().post(f"/v1/episodes/{eid}/outcome", json=report).status_code == 200
    time.sleep(0.1)
    assert len(p.records(type="episode", episode_id=eid)) == 1


@pytest.mark.parametrize("kind", ["memory", "redis"])
def test_an_ending_that_waits_for_a_turn_outlives_a_zero_retention(
    proxy: ProxyFactory, upstream: FakeUpstream, kind: str
) -> None:
    """An episode ended while one of its calls is in flight stays until that turn settles,
    even with retention_s 0: the turn is counted and the episode's record is written."""
    store: dict[str, Any] = {"kind": kind}
    if kind == "redis":
        require_redis()
        store |= {"url": REDIS_URL, "key_prefix": new_prefix()}
    p, eid = proxy({"store": store, "episodes": {"retention_s": 0}}), new_id("zero-keep")
    try:
        marker = f"slow-{eid}"
        with ThreadPoolExecutor(1) as pool:
            slow = pool.submit(call, p, eid, chat_body(marker), **{"X-Fake-Delay-Ms": "800"})
            deadline = time.monotonic() + 5
            while not seen_upstream(upstream, marker) and time.monotonic() < deadline:
                time.sleep(0.01)
            assert p.http().post(f"/v1/episodes/{eid}/end").status_code == 200
            assert slow.result().status_code == 200
        (record,) = p.wait_records(type="episode", episode_id=eid)
        assert (record["turns_used"], record["end_reason"]) == (1, "abandoned")
    finally:
        if kind == "redis":
            drop_prefix(store["key_prefix"])


# -- headers that say what the proxy did (not what the client asked) -----------------------


def test_a_refused_call_names_no_turn_it_did_not_take(default_proxy: Proxy) -> None:
    eid = new_id()
    spend(default_proxy, eid, 2)
    r = call(default_proxy, eid, chat_body("over"))
    assert r.status_code == 403
    assert "x-episode-turn" not in r.headers, dict(r.headers)
    assert r.headers["x-episode-remaining"] == "0"
    assert default_proxy.episode(eid)["turns_used"] == 2


def test_a_finish_mode_reply_names_no_turn_it_did_not_take(finishing: Proxy) -> None:
    eid = new_id()
    spend(finishing, eid)
    r = call(finishing, eid, chat_body("more"))
    assert r.status_code == 200 and r.headers["x-episode-exhausted"] == "true"
    assert "x-episode-turn" not in r.headers, dict(r.headers)


def test_a_changed_budget_header_after_the_first_call_is_warned(default_proxy: Proxy) -> None:
    eid = new_id()
    first = call(default_proxy, eid, chat_body("one"), **{"X-Episode-Budget": "3"})
    assert "x-episode-warning" not in first.headers
    same = call(default_proxy, eid, chat_body("two"), **{"X-Episode-Budget": "3"})
    assert same.status_code == 200 and "x-episode-warning" not in same.headers
    client = default_proxy.client(default_headers={"X-Episode-Id": eid,
                                                   "X-Episode-Budget": "9"})
    raw = client.chat.completions.with_raw_response.create(
        model="m1", messages=[{"role": "user", "content": "three"}])
    assert raw.http_response.status_code == 200  # the call goes on, on the episode's budget
    warning = raw.headers["x-episode-warning"]
    assert "X-Episode-Budget" in warning and "9" in warning and "3" in warning, warning
    assert raw.headers["x-episode-budget"] == "3" and raw.headers["x-episode-remaining"] == "0"
    r = call(default_proxy, eid, chat_body("four"), **{"X-Episode-Budget": "9",
                                                        "X-Episode-Max-Turns": "12"})
    assert r.status_code == 403  # the budget stayed 3
    assert "X-Episode-Budget" in r.headers["x-episode-warning"]
    assert "X-Episode-Max-Turns" in r.headers["x-episode-warning"]


def test_a_resent_first_call_header_of_any_shape_is_warned_never_a_500(
    default_proxy: Proxy,
) -> None:
    eid = new_id()
    task = ("X-Episode-Task", "t-ü".encode())  # header text is UTF-8
    first = default_proxy.http().post(
        "/v1/chat/completions", content=orjson.dumps(chat_body("one")),
        headers=[("content-type", "application/json"), ("X-Episode-Id", eid),
                 ("X-Episode-Budget", "3"), task])
    assert first.status_code == 200 and default_proxy.episode(eid)["task_id"] == "t-ü"
    same = call(default_proxy, eid, chat_body("two"), **{"X-Episode-Budget": "003"})
    assert "x-episode-warning" not in same.headers  # the same number, written otherwise
    raw = default_proxy.http().post(
        "/v1/chat/completions", content=orjson.dumps(chat_body("three")),
        headers=[("content-type", "application/json"), ("X-Episode-Id", eid),
                 ("X-Episode-Budget", "9" * 5000), task,
                 ("X-Episode-Disclosure", b"\xff\xfe")])
    assert raw.status_code == 200, raw.text
    warning = raw.headers["x-episode-warning"]
    assert "X-Episode-Budget" in warning and len(warning) < 1000 and warning.isascii()
    assert "X-Episode-Task" not in warning  # the same task, sent as UTF-8 bytes
    assert "X-Episode-Disclosure" in warning
