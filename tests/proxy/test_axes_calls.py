"""Budgets in tokens, cost and seconds end to end: the official openai and anthropic clients
through the real proxy to the fake upstream, on every API; clamps, refusals, headers,
records, a time budget that runs out mid-stream, and two replicas sharing one Redis."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from typing import Any

import anthropic
import pytest
from redis_support import REDIS_URL, drop_prefix, require_redis

from budgetproxy.testing import FakeUpstream
from tests.conftest import Proxy, ProxyFactory, assert_openai_error, eventually, new_id

PRICES = {"m1": {"input_per_mtok": 1000.0, "output_per_mtok": 2000.0}}  # $0.001 / $0.002


def upstream_body(upstream: FakeUpstream, eid: str) -> dict[str, Any]:
    mine = [r for r in upstream.requests if r.headers.get("x-test-episode") == eid]
    assert mine, "the upstream saw no call of this episode"
    body: dict[str, Any] = mine[-1].json
    return body


def call_api(p: Proxy, api: str, eid: str, stream: bool, cap: int | None,
             headers: dict[str, str]) -> Any:
    """One model call on `api` with the official client; the raw response (for headers)."""
    hdrs = {"X-Episode-Id": eid, "X-Test-Episode": eid, **headers}
    if api == "messages":
        c = anthropic.Anthropic(base_url=p.url, api_key="k", max_retries=0, timeout=20.0,
                                default_headers=hdrs)
        args = {"model": "m1", "max_tokens": cap or 500,
                "messages": [{"role": "user", "content": "one two three"}]}
        if stream:
            with c.messages.stream(**args) as s:  # type: ignore[arg-type]
                s.get_final_message()
                return s.response
        return c.messages.with_raw_response.create(**args)  # type: ignore[call-overload]
    oc = p.client(default_headers=hdrs)
    extra: dict[str, Any] = {}
    if api == "chat":
        if cap:
            extra["max_tokens"] = cap
        raw = oc.chat.completions.with_raw_response.create(
            model="m1", messages=[{"role": "user", "content": "one two three"}],
            stream=stream, **extra)
    elif api == "completions":
        if cap:
            extra["max_tokens"] = cap
        raw = oc.completions.with_raw_response.create(
            model="m1", prompt="one two three", stream=stream, **extra)
    else:
        if cap:
            extra["max_output_tokens"] = cap
        raw = oc.responses.with_raw_response.create(
            model="m1", input="one two three", stream=stream, **extra)
    parsed = raw.parse()
    if stream:
        for _ in parsed:
            pass
    return raw


def settled_episode(p: Proxy, eid: str, ready: Callable[[dict[str, Any]], bool]
                    ) -> dict[str, Any]:
    """The episode's view once `ready` holds for it: a streamed call settles just after its
    answer is sent, and a streaming client stops reading at the answer's last event, so a
    view read at once may come before the settle."""
    return eventually(lambda: p.episode(eid), ready)


CAP_FIELD = {"chat": "max_completion_tokens", "completions": "max_tokens",
             "responses": "max_output_tokens", "messages": "max_tokens"}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("api", ["chat", "completions", "responses", "messages"])
def test_a_token_budget_clamps_the_output_cap_and_counts_reported_usage(
        proxy: ProxyFactory, upstream: FakeUpstream, api: str, stream: bool) -> None:
    p = proxy({})
    eid = new_id()
    raw = call_api(p, api, eid, stream, 500, {"X-Episode-Token-Budget": "60"})
    sent = upstream_body(upstream, eid)
    field = "max_tokens" if api == "chat" else CAP_FIELD[api]  # chat: the client's own field
    assert sent[field] == 60  # lowered from the client's 500 to the budget
    ep = settled_episode(p, eid, lambda ep: ep["tokens_used"] > 0)
    assert ep["token_budget"] == 60 and 0 < ep["tokens_used"] < 60
    # A whole answer's head says what is left once it settles (it read 0 while budget was
    # left: the call's hold); a stream's head goes out before its usage: what its hold leaves.
    left = 0 if stream else 60 - ep["tokens_used"]
    assert int(raw.headers["x-episode-tokens-remaining"]) == left
    assert ep["exhausted_by"] is None
    # a second call gets what is left, never more than its own cap
    call_api(p, api, eid, stream, 5, {})
    assert upstream_body(upstream, eid)[field] == 5
    ep2 = settled_episode(p, eid, lambda ep2: ep2["tokens_used"] > ep["tokens_used"])
    assert ep2["tokens_used"] > ep["tokens_used"]
    recs = p.wait_records(2, episode_id=eid, type="turn")
    assert [r["cumulative"]["tokens"] for r in recs] == [ep["tokens_used"], ep2["tokens_used"]]
    assert [r["cumulative"]["turns"] for r in recs] == [1, 2]


def test_a_request_with_no_cap_gets_one_and_a_spent_budget_is_refused(
        proxy: ProxyFactory, upstream: FakeUpstream) -> None:
    p = proxy({})
    eid = new_id()
    c = p.client(default_headers={"X-Episode-Id": eid, "X-Test-Episode": eid,
                                  "X-Episode-Token-Budget": "12"})
    for _ in range(6):
        try:
            c.chat.completions.create(model="m1", messages=[{"role": "user",
                                                             "content": "a b c d"}])
        except Exception:
            break
    assert upstream_body(upstream, eid)["max_completion_tokens"] <= 12
    r = p.http().post("/v1/chat/completions", headers={"X-Episode-Id": eid}, json={
        "model": "m1", "messages": [{"role": "user", "content": "x"}]})
    assert_openai_error(r, 403, "token_budget_exhausted")
    ep = p.episode(eid)
    assert ep["exhausted_by"] == "tokens" and ep["exhausted"] is True
    p.http().post(f"/v1/episodes/{eid}/end")
    rec = p.wait_records(1, episode_id=eid, type="episode")[0]
    assert rec["exhausted_by"] == "tokens" and rec["end_reason"] == "exhausted"
    assert rec["token_budget"] == 12 and rec["tokens_used"] >= 12


def test_a_cost_budget_clamps_to_what_it_buys_and_charges_the_price(
        proxy: ProxyFactory, upstream: FakeUpstream) -> None:
    p = proxy({"prices": PRICES})
    eid = new_id()
    raw = call_api(p, "chat", eid, False, 100, {"X-Episode-Cost-Budget": "0.02"})
    assert upstream_body(upstream, eid)["max_tokens"] == 10  # $0.02 at $0.002 per output token
    usage = raw.parse().usage
    ep = p.episode(eid)
    expected = usage.prompt_tokens * 0.001 + usage.completion_tokens * 0.002
    assert ep["cost_used"] == pytest.approx(expected) and ep["cost_budget"] == 0.02
    assert raw.headers["x-episode-cost-remaining"] == "%.6f" % (0.02 - expected)  # settled
    rec = p.wait_records(1, episode_id=eid, type="turn")[0]
    assert rec["cumulative"]["cost"] == pytest.approx(expected)


def test_a_cost_budget_on_a_model_without_a_price_is_a_clear_400(proxy: ProxyFactory) -> None:
    p = proxy({})
    r = p.http().post("/v1/chat/completions", headers={
        "X-Episode-Id": new_id(), "X-Episode-Cost-Budget": "1"},
        json={"model": "m1", "messages": [{"role": "user", "content": "x"}]})
    assert_openai_error(r, 400, "invalid_request", "model")


def test_bad_axis_headers_are_400(proxy: ProxyFactory) -> None:
    p = proxy({})
    for name, value in [("X-Episode-Token-Budget", "-3"), ("X-Episode-Cost-Budget", "abc"),
                        ("X-Episode-Time-Budget", "0"), ("X-Episode-Cost-Budget", "inf")]:
        r = p.http().post("/v1/chat/completions", headers={"X-Episode-Id": new_id(),
                                                           name: value},
                          json={"model": "m1", "messages": [{"role": "user", "content": "x"}]})
        assert_openai_error(r, 400, "invalid_request")


def test_a_time_budget_that_expires_mid_stream_closes_it_and_exhausts_the_episode(
        proxy: ProxyFactory, upstream: FakeUpstream) -> None:
    p = proxy({})
    eid = new_id()
    c = p.client(default_headers={"X-Episode-Id": eid, "X-Test-Episode": eid,
                                  "X-Episode-Time-Budget": "1.0"})
    t0 = time.monotonic()
    chunks = []
    stream = c.chat.completions.create(
        model="m1", messages=[{"role": "user", "content": "w " * 40}], stream=True,
        extra_headers={"X-Fake-Chunks": "30", "X-Fake-Chunk-Gap-Ms": "100"})
    for chunk in stream:  # ends cleanly where the proxy closed it
        chunks.append(chunk)
    elapsed = time.monotonic() - t0
    assert 0.8 < elapsed < 2.5, elapsed  # the upstream would have taken 3 s
    assert 0 < len(chunks) < 30
    ep = settled_episode(p, eid, lambda ep: ep["exhausted_by"] is not None)
    assert ep["exhausted_by"] == "time" and ep["time_budget_s"] == 1.0
    assert ep["time_used_s"] >= 1.0 and ep["turns_used"] == 1  # bytes reached it: charged
    r = p.http().post("/v1/chat/completions", headers={"X-Episode-Id": eid}, json={
        "model": "m1", "messages": [{"role": "user", "content": "x"}]})
    assert_openai_error(r, 403, "time_budget_exhausted")
    rec = p.wait_records(1, episode_id=eid, type="turn")[0]
    assert rec["cumulative"]["seconds"] >= 1.0 and rec["cumulative"]["turns"] == 1


@pytest.mark.parametrize("stream", [False, True])
def test_a_time_budget_that_expires_before_the_answer_finishes_the_call(
        proxy: ProxyFactory, upstream: FakeUpstream, stream: bool) -> None:
    p = proxy({"budget": {"on_exhausted": "finish", "finish_reason": "length"}})
    eid = new_id()
    c = p.client(default_headers={"X-Episode-Id": eid, "X-Test-Episode": eid,
                                  "X-Episode-Time-Budget": "0.5"})
    t0 = time.monotonic()
    raw = c.chat.completions.with_raw_response.create(
        model="m1", messages=[{"role": "user", "content": "x"}], stream=stream,
        extra_headers={"X-Fake-Delay-Ms": "3000"})
    parsed = raw.parse()
    if stream:
        parsed = list(parsed)
    finish = [ch.choices[0].finish_reason for ch in parsed if ch.choices][-1] if stream else (
        parsed.choices[0].finish_reason)
    assert time.monotonic() - t0 < 2.0
    assert finish == "length" and raw.headers["x-episode-exhausted"] == "true"
    assert 0.0 <= float(raw.headers["x-episode-time-remaining"]) <= 0.5
    ep = settled_episode(p, eid, lambda ep: ep["exhausted_by"] is not None)
    assert ep["exhausted_by"] == "time" and ep["turns_used"] == 0  # its turn given back
    # the reply names the axis that ran out, and its record holds it as the client had it
    text = "".join(ch.choices[0].delta.content or "" for ch in parsed if ch.choices) if (
        stream) else parsed.choices[0].message.content
    assert text == "[Time budget exhausted] This episode has no time left."
    (rec,) = p.wait_records(1, type="turn", episode_id=eid)
    assert (rec["status"], rec["http_status"], rec["charged"]) == ("synthetic", 200, False)
    assert rec["response"]["content"] == text and rec["finish_reason"] == "length"


def test_a_time_budget_past_the_upstream_timeout_leaves_the_call_to_that_timeout(
        proxy: ProxyFactory, upstream: FakeUpstream) -> None:
    """Such a call needs no timer of the episode's (the upstream's timeout comes first): a
    slow upstream is a 504 and the turn is given back, the time budget untouched."""
    p = proxy({"upstreams": [{"name": "slow", "base_url": upstream.base_url,
                              "timeout_s": 0.3}]})
    eid = new_id()
    r = p.http().post("/v1/chat/completions", json={
        "model": "m1", "messages": [{"role": "user", "content": "x"}]}, headers={
        "X-Episode-Id": eid, "X-Test-Episode": eid, "X-Episode-Time-Budget": "3600",
        "X-Fake-Delay-Ms": "2000"})
    assert_openai_error(r, 504, "upstream_timeout")
    ep = p.episode(eid)
    assert ep["exhausted_by"] is None and ep["turns_used"] == 0


def test_the_episode_api_takes_every_axis_and_the_template_tells_them(
        proxy: ProxyFactory, upstream: FakeUpstream) -> None:
    template = ("[Budget] {remaining} turns, {tokens_remaining} of {tokens_total} tokens, "
                "${cost_remaining:.3f} left, {seconds_remaining}s.")
    p = proxy({"prices": PRICES, "disclosure": {"mode": "disclosed", "template": template}})
    r = p.http().post("/v1/episodes", json={"budget": 5, "token_budget": 1000,
                                            "cost_budget": 0.5, "time_budget_s": 600,
                                            "announced_tokens": 2000})
    assert r.status_code == 201, r.text
    body = r.json()
    assert (body["token_budget"], body["cost_budget"], body["time_budget_s"]) == (
        1000, 0.5, 600)
    eid = body["episode_id"]
    c = p.client(default_headers={"X-Episode-Id": eid, "X-Test-Episode": eid})
    c.chat.completions.create(model="m1", messages=[{"role": "user", "content": "hi"}])
    text = upstream_body(upstream, eid)["messages"][-1]["content"]
    assert "4 turns, 2000 of 2000 tokens, $0.500 left, 600s." in text
    bad = p.http().post("/v1/episodes", json={"cost_budget": -1})
    assert_openai_error(bad, 400, "invalid_request")


def test_turn_only_episodes_carry_no_axis_headers_and_turn_cumulative(
        proxy: ProxyFactory, upstream: FakeUpstream) -> None:
    p = proxy({})
    eid = new_id()
    raw = call_api(p, "chat", eid, False, 50, {})
    assert "x-episode-tokens-remaining" not in raw.headers
    assert upstream_body(upstream, eid)["max_tokens"] == 50  # untouched
    rec = p.wait_records(1, episode_id=eid, type="turn")[0]
    assert rec["cumulative"] == {"turns": 1, "tokens": None, "cost": None, "seconds": None}
    ep = p.episode(eid)
    assert ep["exhausted_by"] is None and ep["token_budget"] is None


@pytest.mark.redis
def test_two_replicas_on_one_redis_share_the_token_budget(
        proxy: ProxyFactory, upstream: FakeUpstream) -> None:
    require_redis()
    prefix = f"bptest-axes-{uuid.uuid4().hex[:8]}"
    store = {"kind": "redis", "url": REDIS_URL, "key_prefix": prefix}
    try:
        a = proxy({"store": store}, fresh=True)
        b = proxy({"store": store}, fresh=True)
        eid = new_id()
        hdrs = {"X-Episode-Id": eid, "X-Test-Episode": eid, "X-Episode-Token-Budget": "30"}
        statuses = []
        for i in range(12):
            r = (a if i % 2 else b).http().post("/v1/chat/completions", headers=hdrs, json={
                "model": "m1", "max_tokens": 8,
                "messages": [{"role": "user", "content": f"a b {i}"}]})
            statuses.append(r.status_code)
        assert 200 in statuses and statuses[-1] == 403
        ep_a, ep_b = a.episode(eid), b.episode(eid)
        assert ep_a["tokens_used"] == ep_b["tokens_used"] >= 30
        assert ep_a["exhausted_by"] == "tokens"
        outs = [r.json["max_tokens"] for r in upstream.requests
                if r.headers.get("x-test-episode") == eid]
        assert sum(outs) <= 30 + 8  # output caps held never pass the budget (+1 clamp)
    finally:
        drop_prefix(prefix)


def test_metrics_count_spend_per_episode_and_exhaustion_by_axis(
        proxy: ProxyFactory, upstream: FakeUpstream) -> None:
    p = proxy({"metrics": {"enabled": True}, "prices": PRICES}, fresh=True)
    eid = new_id()
    hdrs = {"X-Episode-Id": eid, "X-Test-Episode": eid, "X-Episode-Token-Budget": "10",
            "X-Episode-Cost-Budget": "5"}
    for _ in range(3):
        p.http().post("/v1/chat/completions", headers=hdrs, json={
            "model": "m1", "messages": [{"role": "user", "content": "a b c"}]})
    p.http().post(f"/v1/episodes/{eid}/end")
    p.wait_records(1, episode_id=eid, type="episode")
    text = p.http().get("/metrics").text
    line = next(ln for ln in text.splitlines()
                if ln.startswith("budgetproxy_episodes_exhausted_total{"))
    assert 'axis="tokens"' in line and line.endswith(" 1.0")
    assert 'budgetproxy_episode_tokens_bucket{disclosure="hidden",le="250.0",' \
           'outcome="exhausted",tier="n/a"} 1.0' in text
    assert "budgetproxy_episode_cost_usd_count" in text
    assert "budgetproxy_episode_seconds_sum" in text


def test_a_time_budget_cuts_an_anthropic_stream_cleanly(
        proxy: ProxyFactory, upstream: FakeUpstream) -> None:
    p = proxy({})
    eid = new_id()
    c = anthropic.Anthropic(base_url=p.url, api_key="k", max_retries=0, timeout=20.0,
                            default_headers={"X-Episode-Id": eid, "X-Test-Episode": eid,
                                             "X-Episode-Time-Budget": "1.0"})
    t0 = time.monotonic()
    events = []
    with c.messages.stream(model="m1", max_tokens=100, messages=[
            {"role": "user", "content": "w " * 40}],
            extra_headers={"X-Fake-Chunks": "30", "X-Fake-Chunk-Gap-Ms": "100"}) as s:
        for ev in s:
            events.append(ev.type)
    assert time.monotonic() - t0 < 2.5
    assert "message_start" in events and "message_stop" not in events
    ep = settled_episode(p, eid, lambda ep: ep["exhausted_by"] is not None)
    assert ep["exhausted_by"] == "time" and ep["turns_used"] == 1
    r = p.http().post("/v1/messages", headers={"X-Episode-Id": eid}, json={
        "model": "m1", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 403 and r.json()["type"] == "error"
    assert r.json()["error"]["type"] == "permission_error"


@pytest.mark.parametrize("api", ["responses", "messages"])
def test_axis_fields_are_disclosed_on_responses_and_messages(
        proxy: ProxyFactory, upstream: FakeUpstream, api: str) -> None:
    template = "[Budget] {tokens_remaining} tokens left of {tokens_total}; {seconds_total}s."
    p = proxy({"disclosure": {"mode": "disclosed", "template": template}})
    eid = new_id()
    call_api(p, api, eid, False, 50, {"X-Episode-Token-Budget": "900",
                                      "X-Episode-Time-Budget": "300"})
    sent = json.dumps(upstream_body(upstream, eid))
    assert "[Budget] 900 tokens left of 900; 300s." in sent  # before this turn's spend
    call_api(p, api, eid, False, 50, {})
    used = p.episode(eid)["tokens_used"]
    assert used > 0
    rec = p.wait_records(2, episode_id=eid, type="turn")[-1]
    assert rec["disclosure"]["text"].startswith("[Budget] ")
    assert rec["disclosure"]["text"] != "[Budget] 900 tokens left of 900; 300s."


@pytest.mark.parametrize("store", ["memory", "redis"])
def test_history_keep_re_applies_each_turns_axis_text_as_it_was(
        proxy: ProxyFactory, upstream: FakeUpstream, store: str) -> None:
    over: dict[str, Any] = {"disclosure": {"mode": "disclosed",
                                           "template": "[{tokens_remaining} tokens left]"}}
    prefix = f"bptest-told-{uuid.uuid4().hex[:8]}"
    if store == "redis":
        require_redis()
        over["store"] = {"kind": "redis", "url": REDIS_URL, "key_prefix": prefix}
    try:
        p = proxy(over, fresh=True)
        eid = new_id()
        c = p.client(default_headers={"X-Episode-Id": eid, "X-Test-Episode": eid,
                                      "X-Episode-Token-Budget": "5000"})
        messages: list[dict[str, Any]] = []
        sent = []
        for n in range(3):
            messages.append({"role": "user", "content": f"step {n} a b c"})
            r = c.chat.completions.create(model="m1", messages=messages, max_tokens=50)
            sent.append(upstream_body(upstream, eid)["messages"])
            messages.append({"role": "assistant", "content": r.choices[0].message.content})
        # every turn's upstream conversation starts with the previous one, texts as they were
        for before, after in zip(sent, sent[1:], strict=False):
            assert after[:len(before)] == before
        texts = [m["content"].rsplit("\n\n", 1)[-1] for m in sent[-1] if m["role"] == "user"]
        assert texts[0] == "[5000 tokens left]" and len(set(texts)) == 3
    finally:
        if store == "redis":
            drop_prefix(prefix)


def test_a_call_finding_the_rest_held_by_one_in_flight_gets_a_429_and_the_episode_lives(
        proxy: ProxyFactory, upstream: FakeUpstream) -> None:
    import threading

    p = proxy({})
    eid = new_id()
    hdrs = {"X-Episode-Id": eid, "X-Episode-Token-Budget": "100"}
    slow = threading.Thread(target=lambda: p.http(timeout=10).post(
        "/v1/chat/completions", headers={**hdrs, "X-Fake-Delay-Ms": "1200"},
        json={"model": "m1", "max_tokens": 100, "messages": [{"role": "user", "content": "a"}]}))
    slow.start()
    time.sleep(0.4)
    r = p.http().post("/v1/chat/completions", headers=hdrs, json={
        "model": "m1", "max_tokens": 10, "messages": [{"role": "user", "content": "b"}]})
    assert_openai_error(r, 429, "budget_held")
    assert r.headers["retry-after"] == "1"
    slow.join()
    assert p.episode(eid)["exhausted_by"] is None
    r = p.http().post("/v1/chat/completions", headers=hdrs, json={
        "model": "m1", "max_tokens": 10, "messages": [{"role": "user", "content": "b"}]})
    assert r.status_code == 200


def test_extreme_axis_values_are_answered_never_a_500(proxy: ProxyFactory) -> None:
    p = proxy({"prices": PRICES})
    cases = [({"X-Episode-Time-Budget": "1e308", "X-Episode-Token-Budget": "2147483647",
               "X-Episode-Cost-Budget": "1e300"}, 200),
             ({"X-Episode-Cost-Budget": "1e-300"}, 403),  # buys no output token at all
             ({"X-Episode-Token-Budget": "99999999999999"}, 400)]
    for headers, status in cases:
        r = p.http().post("/v1/chat/completions", headers={"X-Episode-Id": new_id(), **headers},
                          json={"model": "m1", "max_tokens": -5,
                                "messages": [{"role": "user", "content": "x"}]})
        assert r.status_code == status, (headers, r.text)
    r = p.http().post("/v1/episodes", json={"time_budget_s": 1e308, "token_budget": 5})
    assert r.status_code == 201
