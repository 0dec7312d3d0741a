"""OTLP/HTTP export: batches, queue limits, failures, and the two span paths of Tracing
compared over a real local collector (the fake upstream keeps what is POSTed to /v1/traces)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from span_support import make_span

from budgetproxy.telemetry.otlp import SpanEncoder
from budgetproxy.telemetry.otlp_export import OtlpBatchProcessor, build_exporter
from budgetproxy.testing.fake_upstream import FakeUpstream


@pytest.fixture()
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeUpstream]:
    """The fake upstream as the OTLP/HTTP collector (it keeps the bodies POSTed to /v1/traces)."""
    with FakeUpstream() as up:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", up.base_url.removesuffix("/v1"))
        yield up


def test_processor_sends_the_fast_encoding(receiver: FakeUpstream) -> None:
    resource = Resource.create({"service.name": "x"})
    spans = [make_span(i, {"i": i}, resource=resource) for i in range(3)]
    processor = OtlpBatchProcessor(build_exporter())
    # the installed SDK exporter still has the HTTP client the fast path hands bytes to
    assert processor._client is not None
    for s in spans:
        processor.on_end(s)
    processor.force_flush()
    assert receiver.traces == [SpanEncoder().request(spans)]
    assert processor.sent == 3
    processor.shutdown()


def test_batches_are_cut_at_the_batch_size(receiver: FakeUpstream,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "4")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "60000")
    resource = Resource.create({"service.name": "x"})
    processor = OtlpBatchProcessor(build_exporter())
    spans = [make_span(i, {"i": i}, resource=resource) for i in range(10)]
    for s in spans:
        processor.on_end(s)
    processor.shutdown()  # sends what is left
    sizes = []
    for body in receiver.traces:
        req = ExportTraceServiceRequest()
        req.ParseFromString(body)
        sizes.append(sum(len(ss.spans) for rs in req.resource_spans for ss in rs.scope_spans))
    assert sorted(sizes) == [2, 4, 4]
    assert processor.sent == 10


def test_spans_with_events_go_through_the_sdk_encoder(receiver: FakeUpstream) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with provider.get_tracer("t").start_as_current_span("with event") as s:
        s.add_event("something", {"k": "v"})
    spans = list(exporter.get_finished_spans())
    processor = OtlpBatchProcessor(build_exporter())
    processor.on_end(spans[0])
    processor.force_flush()
    req = ExportTraceServiceRequest()
    req.ParseFromString(receiver.traces[-1])
    assert req == encode_spans(spans)
    processor.shutdown()


def test_a_full_queue_drops_instead_of_growing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "5")
    monkeypatch.setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "5")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "60000")

    class Stuck(InMemorySpanExporter):
        _client = None  # no fast path: spans wait for export()

        def export(self, spans: Any) -> SpanExportResult:
            time.sleep(0.5)
            return SpanExportResult.FAILURE

    processor = OtlpBatchProcessor(Stuck())
    resource = Resource.create({"service.name": "x"})
    for i in range(20):
        processor.on_end(make_span(i, {}, resource=resource))
    assert processor.dropped >= 10
    processor.shutdown()
    assert processor.sent == 0


def test_a_span_that_cannot_be_encoded_costs_only_itself(receiver: FakeUpstream) -> None:
    """Deferred spans are encoded on the export thread: a failure there is counted and the
    rest of the batch still goes out."""
    resource = Resource.create({"service.name": "x"})
    spans = [make_span(i, {"i": i}, resource=resource) for i in range(3)]
    counts: list[tuple[str, int]] = []

    class Deferred:
        def __init__(self, span: ReadableSpan | None) -> None:
            self.span, self.resource, self.scope = span, resource, None

        def encode(self, encoder: SpanEncoder) -> bytes:
            if self.span is None:
                raise ValueError("not a span")
            return encoder.span(self.span)

    processor = OtlpBatchProcessor(build_exporter(), lambda result, n: counts.append((result, n)))
    for item in (Deferred(spans[0]), Deferred(None), Deferred(spans[1]), Deferred(spans[2])):
        processor.defer(item)
    processor.force_flush()
    assert receiver.traces == [SpanEncoder().request(spans)]
    assert (processor.sent, processor.failed) == (3, 1)
    assert sorted(counts) == [("exported", 3), ("failed", 1)]
    processor.shutdown()


@pytest.mark.parametrize("capture_content", [False, True])
def test_proxy_spans_encoded_directly_match_the_sdk_path(
        receiver: FakeUpstream, monkeypatch: pytest.MonkeyPatch, capture_content: bool) -> None:
    """The two ways Tracing builds a span: OTLP bytes for its own exporter, a ReadableSpan for
    any other processor. Same calls in, the same protobuf out: with and without content, a
    parent or the parent's trace state, and with the encoder's caches cold and warm."""
    from budgetproxy.config import UpstreamConfig
    from budgetproxy.core.episode import EpisodeState, Grant, GrantKind
    from budgetproxy.telemetry.tracing import Tracing

    monkeypatch.setattr(time, "time_ns", lambda: 1_764_000_000_000_000_000)
    resource = Resource.create({"service.name": "same"})
    direct = OtlpBatchProcessor(build_exporter())
    memory = InMemorySpanExporter()
    fast = Tracing(direct, resource=resource, capture_content=capture_content)
    slow = Tracing(SimpleSpanProcessor(memory), resource=resource,
                   capture_content=capture_content)
    assert fast._direct is direct and slow._direct is None
    up = UpstreamConfig(base_url="http://127.0.0.1:9/v1")
    calls: list[dict[str, Any]] = []
    for i in range(24):
        st = EpisodeState(episode_id=f"ep-{i % 3}", budget=10 + i % 2, max_turns=20,
                          disclosure="disclosed" if i % 2 else "hidden",
                          task_id="t1" if i % 4 else None)
        calls.append(dict(
            kind="chat" if i % 5 else "completions", model=f"m{i % 2}", upstream=up,
            episode_id=st.episode_id if i % 6 else None, state=st if i % 6 else None,
            grant=Grant(kind=GrantKind.FORWARD, turn=i, attempt=1 + i % 2, charged=i % 3 > 0)
            if i % 6 else None,
            status=200 if i % 7 else 502,
            error_class=None if i % 7 else "status_5xx" if i % 14 else None,
            reply={"usage": {"prompt_tokens": 5 * i, "completion_tokens": i} if i % 8 else None,
                   "finish_reason": "stop" if i % 2 else None,
                   "message": {"role": "assistant", "content": f"answer {i}"}},
            conversation=[{"role": "user", "content": f"question {i}"}],
        ))
    parent = {b"traceparent": b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
    headers = [{}, parent, {**parent, b"tracestate": b"vendor=1,other=x"}]
    for i, call in enumerate(calls):
        ct = fast.start(call["kind"], call["model"], headers[i % 3])
        assert ct is not None
        fast.finish(ct, **call)
        slow.finish(ct, **call)
    direct.force_flush()
    ours = ExportTraceServiceRequest()
    for body in receiver.traces:
        part = ExportTraceServiceRequest()
        part.ParseFromString(body)
        ours.MergeFrom(part)
    spans = list(memory.get_finished_spans())
    assert len(spans) == 24
    assert ours == encode_spans(spans)
    direct.shutdown()


def test_a_queued_span_keeps_the_values_its_call_ended_with(receiver: FakeUpstream) -> None:
    """Spans wait for their batch as values: the episode moving on meanwhile (its next turn,
    a reused grant) must not change what the finished call's span says."""
    from budgetproxy.config import UpstreamConfig
    from budgetproxy.core.episode import EpisodeState, Grant, GrantKind
    from budgetproxy.telemetry.tracing import Tracing

    processor = OtlpBatchProcessor(build_exporter())
    tracing = Tracing(processor, resource=Resource.create({"service.name": "later"}))
    st = EpisodeState(episode_id="ep-1", budget=10, max_turns=20, disclosure="hidden",
                      turns_used=3)
    grant = Grant(kind=GrantKind.FORWARD, turn=3, attempt=1, charged=True)
    ct = tracing.start("chat", "m", {})
    assert ct is not None
    tracing.finish(ct, kind="chat", model="m", upstream=UpstreamConfig(base_url="http://u/v1"),
                   episode_id="ep-1", state=st, grant=grant, status=200, error_class=None,
                   reply={"usage": None, "finish_reason": "stop"})
    st.turns_used, grant.turn, grant.attempt = 9, 9, 2  # after finish(), before the export
    processor.force_flush()
    req = ExportTraceServiceRequest()
    req.ParseFromString(receiver.traces[-1])
    (span,) = [s for rs in req.resource_spans for ss in rs.scope_spans for s in ss.spans]
    attrs = {a.key: a.value for a in span.attributes}
    assert attrs["budgetproxy.turn"].int_value == 3
    assert attrs["budgetproxy.attempt"].int_value == 1
    assert attrs["budgetproxy.remaining"].int_value == 7
    processor.shutdown()
