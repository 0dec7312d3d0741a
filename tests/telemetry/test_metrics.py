"""Deferred metric updates: after a flush, the exposition is what prometheus-client's own
observe()/inc() would have produced."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest

from budgetproxy.telemetry.metrics import LATENCY_BUCKETS, OVERHEAD_BUCKETS, Metrics

_CREATED = re.compile(rb"^.*_created\{?.*$\n?", re.MULTILINE)


def _exposition(registry: CollectorRegistry) -> bytes:
    return _CREATED.sub(b"", generate_latest(registry))


values = st.one_of(
    st.floats(min_value=0, max_value=1e4, allow_nan=False),
    st.sampled_from([*LATENCY_BUCKETS, *OVERHEAD_BUCKETS, 0.0, float("inf")]),  # on the bounds
)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["/v1/chat/completions", "/v1/responses"]),
                          values, values, st.integers(0, 10_000)), max_size=40))
def test_deferred_updates_expose_what_direct_ones_would(
        calls: list[tuple[str, float, float, int]]) -> None:
    deferred_reg, direct_reg = CollectorRegistry(), CollectorRegistry()
    deferred, direct = Metrics(deferred_reg), Metrics(direct_reg)
    for route, total, upstream, tokens in calls:
        deferred.child(deferred.request_duration, route).observe(total)
        deferred.child(deferred.overhead, route).observe(upstream)
        deferred.child(deferred.tokens, "m", "input").inc(tokens)
        deferred.child(deferred.requests, route, "200").inc()
        direct.request_duration.labels(route).observe(total)
        direct.overhead.labels(route).observe(upstream)
        direct.tokens.labels("m", "input").inc(tokens)
        direct.requests.labels(route, "200").inc()
    # generate_latest collects the registry, and collecting flushes first
    assert _exposition(deferred_reg) == _exposition(direct_reg)


def test_updates_wait_for_a_flush_and_apply_once() -> None:
    reg = CollectorRegistry()
    m = Metrics(reg)
    m.child(m.turns, "50%", "hidden").inc()
    m.child(m.request_duration, "/v1/chat/completions").observe(0.003)
    raw = m.turns.labels("50%", "hidden")
    assert raw._value.get() == 0  # not applied yet
    m.flush()
    m.flush()  # nothing new: nothing more
    assert raw._value.get() == 1
    assert reg.get_sample_value("budgetproxy_turns_total",
                                {"tier": "50%", "disclosure": "hidden"}) == 1
    assert reg.get_sample_value("budgetproxy_request_duration_seconds_count",
                                {"route": "/v1/chat/completions"}) == 1
    m.child(m.turns, "50%", "hidden").inc(2)
    # reading through the registry flushes
    assert reg.get_sample_value("budgetproxy_turns_total",
                                {"tier": "50%", "disclosure": "hidden"}) == 3


def test_call_site_children_are_the_labelled_series_and_stay_bounded() -> None:
    registry = CollectorRegistry()
    m = Metrics(registry)
    m.turns_child(5, 20, "hidden").inc()
    m.turns_child(5, 20, "hidden").inc()
    m.turns_child(7, None, "disclosed").inc()
    tokens_in, tokens_out = m.token_children("qwen3-4b")
    tokens_in.inc(100)
    tokens_out.inc(7)
    duration, overhead, requests = m.call_children("/v1/chat/completions", 403)
    requests.inc()
    duration.observe(0.01)
    overhead.observe(0.001)
    text = _exposition(registry).decode()
    assert 'budgetproxy_turns_total{disclosure="hidden",tier="25%"} 2.0' in text
    assert 'budgetproxy_turns_total{disclosure="disclosed",tier="n/a"} 1.0' in text
    assert 'budgetproxy_tokens_total{direction="input",model="qwen3-4b"} 100.0' in text
    assert 'budgetproxy_requests_total{code="403",route="/v1/chat/completions"} 1.0' in text
    assert ('budgetproxy_request_duration_seconds_count{route="/v1/chat/completions"} 1.0'
            in text)
    # Client-chosen model names and budgets bound both the labels and the caches.
    for i in range(5000):
        m.token_children(f"model-{i}")[0].inc()
        m.turns_child(i + 1, None, "hidden")
    assert len(m._token_children) <= 4096 and len(m._turn_children) <= 4096
    text = _exposition(registry).decode()
    assert len(re.findall(r'budgetproxy_tokens_total\{direction="input"', text)) == 33
    assert 'budgetproxy_tokens_total{direction="input",model="other"}' in text
