"""The OTLP span encoder: byte-for-byte what the SDK's protobuf encoder means, only faster."""

from __future__ import annotations

import tracemalloc
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState
from span_support import make_span

from budgetproxy.telemetry.otlp import SpanEncoder


def _same_as_sdk(spans: list[ReadableSpan]) -> None:
    ours = ExportTraceServiceRequest()
    ours.ParseFromString(SpanEncoder().request(spans))
    assert ours == encode_spans(spans)


def test_proxy_shaped_spans_match_the_sdk_encoder() -> None:
    resource = Resource.create({"service.name": "budgetproxy-test", "k8s.pod.name": "p-1"})
    scope = InstrumentationScope("budgetproxy", "0.1.0")
    parent = SpanContext(0x1234, 0x99, True, TraceFlags(1))
    spans = [
        make_span(i, {
            "gen_ai.operation.name": "chat", "gen_ai.request.model": f"m{i % 3}",
            "gen_ai.conversation.id": f"ep-{i}", "budgetproxy.budget": 20,
            "budgetproxy.remaining": i - 5, "budgetproxy.charged": i % 2 == 0,
            "gen_ai.response.finish_reasons": ("stop",), "ratio": i / 7,
        }, resource=resource, scope=scope if i % 4 else None,
            parent=parent if i % 5 == 0 else None,
            status=Status(StatusCode.ERROR, "boom") if i % 6 == 0 else None,
            trace_state=TraceState([("vendor", "x")]) if i % 7 == 0 else None)
        for i in range(40)
    ]
    # a second resource, as when spans of two providers share an exporter, between spans of
    # the first: each resource and scope is still sent once, with all of its spans
    spans += [make_span(99, {"a": 1}, resource=Resource.create({"service.name": "other"})),
              make_span(100, {"a": 2}, resource=resource, scope=scope)]
    _same_as_sdk(spans)


def test_sdk_made_spans_match_too() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "t"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("scope-a", "9.9", schema_url="https://example.com/s")
    for i in range(5):
        with tracer.start_as_current_span(f"op {i}", kind=SpanKind(i % 5)) as s:
            s.set_attribute("n", i)
            s.set_attribute("list", [1, 2, 3])
    _same_as_sdk(list(exporter.get_finished_spans()))


_scalar = st.one_of(
    st.text(max_size=40), st.booleans(), st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False), st.binary(max_size=20),
)
_value = st.one_of(_scalar, st.lists(_scalar, max_size=4).map(tuple),
                   st.dictionaries(st.text(max_size=8), _scalar, max_size=3))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.dictionaries(st.text(min_size=1, max_size=30), _value, max_size=8),
                min_size=1, max_size=6))
def test_any_attribute_values_match_the_sdk_encoder(attr_sets: list[dict[str, Any]]) -> None:
    resource = Resource.create({"service.name": "h"})
    _same_as_sdk([make_span(i, a, resource=resource) for i, a in enumerate(attr_sets)])


def test_negative_zero_is_not_served_from_the_cache() -> None:
    resource = Resource.create({"service.name": "z"})
    _same_as_sdk([make_span(0, {"x": 0.0}, resource=resource),
                  make_span(1, {"x": -0.0}, resource=resource)])


def test_a_batch_is_assembled_with_one_copy_of_its_bytes() -> None:
    """Each nested join used to copy the whole request (five ~180 KB copies per 512-span
    batch, each mapped and unmapped by the C library: page faults on every batch). The
    request's bytes are now made once."""
    resource = Resource.create({"service.name": "one-copy"})
    encoder = SpanEncoder()
    items = [(resource, None, encoder.span(make_span(i, {"i": i, "text": "x" * 200},
                                                      resource=resource)))
             for i in range(512)]
    encoder.assemble(items)  # warm the encoder's caches
    tracemalloc.start()
    try:
        body = encoder.assemble(items)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(body) > 100_000
    assert peak < 2 * len(body), (peak, len(body))  # the bytes, and join's piece table
    ours = ExportTraceServiceRequest()
    ours.ParseFromString(body)
    assert sum(len(ss.spans) for rs in ours.resource_spans for ss in rs.scope_spans) == 512
