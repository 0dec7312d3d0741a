"""Hand-made SDK spans for the OTLP encoder and exporter tests."""

from __future__ import annotations

from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState


def make_span(i: int, attrs: dict[str, Any], *, resource: Resource, scope: Any = None,
              parent: SpanContext | None = None, status: Status | None = None,
              trace_state: TraceState | None = None) -> ReadableSpan:
    """The i-th of a run of distinct client spans named like the proxy's."""
    ctx = SpanContext(0x0AF7651916CD43DD8448EB211C80319C + i, 0xB7AD6B7169203331 + i, False,
                      TraceFlags(1), trace_state)
    return ReadableSpan(f"chat m{i % 3}", ctx, parent, resource, attrs, kind=SpanKind.CLIENT,
                        status=status or Status(StatusCode.UNSET), start_time=1_700_000_000 + i,
                        end_time=1_700_000_500 + i, instrumentation_scope=scope)
