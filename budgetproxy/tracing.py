"""OpenTelemetry tracing: one span per model call, GenAI conventions, never failing a call."""

from __future__ import annotations

import logging
import os
from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from budgetproxy.config import TracingConfig, UpstreamConfig
from budgetproxy.core.episode import EpisodeState, Grant

log = logging.getLogger("budgetproxy.tracing")

CallSpan = Span
_OPERATION = {"chat": "chat", "completions": "text_completion", "responses": "chat",
              "messages": "chat"}


def tracing_wanted(cfg: TracingConfig) -> bool:
    if cfg.enabled is not None:
        return cfg.enabled
    return bool(
        os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )


def build_provider() -> Any:
    """An SDK TracerProvider exporting over OTLP/HTTP, configured by the standard OTEL_* vars."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME",
                                                                "budgetproxy")})
    provider = TracerProvider(resource=resource)
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError:
        log.warning("tracing is on but the OTLP exporter is not installed: "
                    "pip install 'budgetproxy[otlp]'")
        return provider
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return provider


class Tracing:
    """Starts and ends model-call spans; a None tracer makes every call a no-op."""

    def __init__(self, tracer: trace.Tracer | None, capture_content: bool = False) -> None:
        self.tracer = tracer
        self.capture_content = capture_content

    def start_call(
        self, kind: str, model: str | None, upstream: UpstreamConfig, episode_id: str | None,
        state: EpisodeState | None, grant: Grant | None,
    ) -> Span | None:
        if self.tracer is None:
            return None
        try:
            op = _OPERATION.get(kind, kind)
            attrs: dict[str, Any] = {
                "gen_ai.operation.name": op,
                "gen_ai.provider.name": "openai" if upstream.kind == "openai" else "litellm",
                "gen_ai.request.model": model or "",
                "server.address": upstream.base_url,
                "budgetproxy.upstream": upstream.name,
            }
            if episode_id is not None:
                attrs["gen_ai.conversation.id"] = episode_id
            if state is not None:
                attrs["budgetproxy.budget"] = state.budget
                attrs["budgetproxy.remaining"] = state.remaining
                attrs["budgetproxy.disclosure"] = state.disclosure
                if state.task_id:
                    attrs["budgetproxy.task_id"] = state.task_id
            if grant is not None:
                attrs["budgetproxy.turn"] = grant.turn
                attrs["budgetproxy.attempt"] = grant.attempt
                attrs["budgetproxy.charged"] = grant.charged
            return self.tracer.start_span(f"{op} {model}", kind=SpanKind.CLIENT,
                                          attributes=attrs)
        except Exception:  # telemetry never fails a call
            log.debug("span start failed", exc_info=True)
            return None

    def inject(self, span: Span | None, headers: dict[str, str]) -> None:
        if span is None:
            return
        try:
            propagate.inject(headers, context=trace.set_span_in_context(span))
        except Exception:
            log.debug("trace context injection failed", exc_info=True)

    def end_call(
        self, span: Span | None, status: int, error_class: str | None,
        usage: dict[str, Any] | None = None, finish_reason: str | None = None,
    ) -> None:
        if span is None:
            return
        try:
            attrs: dict[str, Any] = {"http.response.status_code": status}
            if isinstance(usage, dict):
                tin = usage.get("prompt_tokens", usage.get("input_tokens"))
                tout = usage.get("completion_tokens", usage.get("output_tokens"))
                if isinstance(tin, int):
                    attrs["gen_ai.usage.input_tokens"] = tin
                if isinstance(tout, int):
                    attrs["gen_ai.usage.output_tokens"] = tout
            if finish_reason:
                attrs["gen_ai.response.finish_reasons"] = [finish_reason]
            if error_class is not None or status >= 500:
                attrs["error.type"] = error_class or str(status)
                span.set_status(Status(StatusCode.ERROR))
            span.set_attributes(attrs)
            span.end()
        except Exception:
            log.debug("span end failed", exc_info=True)
