"""OpenTelemetry tracing: one span per model call, GenAI conventions, never failing a call.

Spans are not made through the SDK's Tracer on the hot path; that costs more than the rest of
a call. When a call starts, the proxy draws the span's ids and asks the configured sampler
(`OTEL_TRACES_SAMPLER`), continuing the agent's trace when its request carried a W3C
`traceparent`, so the upstream request carries this span's context. When the call has
finished, one SDK `ReadableSpan` is built from what the call knows and handed to the span
processor: a `BatchSpanProcessor` exporting over OTLP/HTTP (`otlp.py`), or whatever processor
the embedding code passes to `BudgetProxy`. Unsampled calls build nothing.
"""

from __future__ import annotations

import logging
import os
import random
import time
from typing import Any

import orjson
from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.sampling import Decision, Sampler
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import (
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
)

from budgetproxy import __version__
from budgetproxy.config import TracingConfig, UpstreamConfig
from budgetproxy.core.episode import EpisodeState, Grant

log = logging.getLogger("budgetproxy.tracing")

_OPERATION = {"chat": "chat", "completions": "text_completion", "responses": "chat",
              "messages": "chat"}
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_UNSET = Status(StatusCode.UNSET)
_ERROR = Status(StatusCode.ERROR)
_HEX = frozenset("0123456789abcdef")
_SCOPE = InstrumentationScope("budgetproxy", __version__)


def tracing_wanted(cfg: TracingConfig) -> bool:
    if cfg.enabled is not None:
        return cfg.enabled
    return bool(
        os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )


def build_processor() -> SpanProcessor | None:
    """A BatchSpanProcessor exporting over OTLP/HTTP, configured by the standard OTEL_* vars."""
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    try:
        from budgetproxy.otlp import fast_exporter

        exporter = fast_exporter()
    except ImportError:
        log.warning("tracing is on but the OTLP exporter is not installed: "
                    "pip install 'budgetproxy[otlp]'")
        return None
    return BatchSpanProcessor(exporter)


def _parse_traceparent(value: bytes, state: bytes | None) -> SpanContext | None:
    """The remote parent in a W3C traceparent header, or None if it is malformed."""
    try:
        tp = value.decode("ascii").strip().lower()
    except UnicodeDecodeError:
        return None
    parts = tp.split("-")
    if (len(parts) < 4 or len(parts[0]) != 2 or parts[0] == "ff" or len(parts[1]) != 32
            or len(parts[2]) != 16 or len(parts[3]) != 2 or (parts[0] == "00" and len(parts) > 4)
            or not _HEX.issuperset(tp.replace("-", ""))):
        return None
    trace_id, span_id = int(parts[1], 16), int(parts[2], 16)
    if not trace_id or not span_id:
        return None
    trace_state = None
    if state:
        try:
            trace_state = TraceState.from_header([state.decode("latin-1")])
        except Exception:
            trace_state = None
    return SpanContext(trace_id, span_id, is_remote=True,
                       trace_flags=TraceFlags(int(parts[3], 16) & 0x01),
                       trace_state=trace_state)


class CallTrace:
    """The trace context of one model call, drawn when it starts."""

    __slots__ = ("trace_id", "span_id", "parent", "sampled", "start_ns")

    def __init__(self, trace_id: int, span_id: int, parent: SpanContext | None,
                 sampled: bool) -> None:
        self.trace_id = trace_id
        self.span_id = span_id
        self.parent = parent
        self.sampled = sampled
        self.start_ns = time.time_ns()

    def traceparent(self) -> str:
        return f"00-{self.trace_id:032x}-{self.span_id:016x}-{'01' if self.sampled else '00'}"


class Tracing:
    """Model-call spans; a None processor makes every call a no-op."""

    def __init__(
        self, processor: SpanProcessor | None, *, resource: Resource | None = None,
        sampler: Sampler | None = None, capture_content: bool = False,
    ) -> None:
        self.processor = processor
        self.capture_content = capture_content
        self.resource = resource
        self.sampler = sampler
        # The two samplers that need no call into the SDK: the default and always_on.
        self._fast_sampler: str | None = None
        propagators = os.environ.get("OTEL_PROPAGATORS", "tracecontext,baggage")
        # W3C trace context is read and written directly; other propagators go through the API.
        self._w3c = {p.strip() for p in propagators.split(",")} <= {"tracecontext", "baggage"}
        if processor is None:
            return
        if resource is None:
            self.resource = Resource.create(
                {"service.name": os.environ.get("OTEL_SERVICE_NAME", "budgetproxy")})
        if sampler is None:
            # The SDK reads OTEL_TRACES_SAMPLER / _ARG when it makes a provider.
            self.sampler = TracerProvider(shutdown_on_exit=False).sampler
            name = os.environ.get("OTEL_TRACES_SAMPLER", "parentbased_always_on").strip().lower()
            if name in ("parentbased_always_on", "always_on"):
                self._fast_sampler = name

    @property
    def enabled(self) -> bool:
        return self.processor is not None

    def start(self, kind: str, model: str | None, headers: dict[bytes, bytes]) -> CallTrace | None:
        """Draw this call's span context; None when tracing is off or fails."""
        if self.processor is None:
            return None
        try:
            parent = self._parent(headers)
            trace_id = parent.trace_id if parent is not None else random.getrandbits(128) or 1
            if self._fast_sampler == "always_on":
                sampled = True
            elif self._fast_sampler == "parentbased_always_on":
                sampled = parent is None or parent.trace_flags.sampled
            else:
                ctx = (trace.set_span_in_context(NonRecordingSpan(parent)) if parent is not None
                       else Context())
                name = f"{_OPERATION.get(kind, kind)} {model}"
                assert self.sampler is not None
                decision = self.sampler.should_sample(ctx, trace_id, name, SpanKind.CLIENT).decision
                sampled = decision is Decision.RECORD_AND_SAMPLE
            return CallTrace(trace_id, random.getrandbits(64) or 1, parent, sampled)
        except Exception:  # telemetry never fails a call
            log.debug("span start failed", exc_info=True)
            return None

    def _parent(self, headers: dict[bytes, bytes]) -> SpanContext | None:
        if self._w3c:
            tp = headers.get(b"traceparent")
            return None if tp is None else _parse_traceparent(tp, headers.get(b"tracestate"))
        carrier = {k.decode("latin-1"): v.decode("latin-1") for k, v in headers.items()}
        sc = trace.get_current_span(propagate.extract(carrier)).get_span_context()
        return sc if sc.is_valid else None

    def inject(self, ct: CallTrace | None, headers: dict[str, str]) -> None:
        """Put the call's span context on the upstream request."""
        if ct is None:
            return
        try:
            if self._w3c:
                headers["traceparent"] = ct.traceparent()
                if ct.parent is not None and ct.parent.trace_state:
                    headers["tracestate"] = ct.parent.trace_state.to_header()
                return
            propagate.inject(headers, context=trace.set_span_in_context(
                NonRecordingSpan(self._context(ct))))
        except Exception:
            log.debug("trace context injection failed", exc_info=True)

    @staticmethod
    def _context(ct: CallTrace) -> SpanContext:
        return SpanContext(
            ct.trace_id, ct.span_id, is_remote=False,
            trace_flags=_SAMPLED if ct.sampled else TraceFlags(0),
            trace_state=ct.parent.trace_state if ct.parent is not None else None,
        )

    def finish(
        self, ct: CallTrace | None, *, kind: str, model: str | None, upstream: UpstreamConfig,
        episode_id: str | None, state: EpisodeState | None, grant: Grant | None,
        status: int, error_class: str | None, reply: dict[str, Any],
        conversation: list[Any] | None = None,
    ) -> None:
        """Build the finished call's span and hand it to the processor, if it was sampled."""
        if ct is None or not ct.sampled or self.processor is None:
            return
        try:
            op = _OPERATION.get(kind, kind)
            attrs: dict[str, Any] = {
                "gen_ai.operation.name": op,
                "gen_ai.provider.name": "openai" if upstream.kind == "openai" else "litellm",
                "gen_ai.request.model": model or "",
                "server.address": upstream.base_url,
                "budgetproxy.upstream": upstream.name,
                "http.response.status_code": status,
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
            usage = reply.get("usage")
            if isinstance(usage, dict):
                tin = usage.get("prompt_tokens", usage.get("input_tokens"))
                tout = usage.get("completion_tokens", usage.get("output_tokens"))
                if isinstance(tin, int):
                    attrs["gen_ai.usage.input_tokens"] = tin
                if isinstance(tout, int):
                    attrs["gen_ai.usage.output_tokens"] = tout
            finish_reason = reply.get("finish_reason")
            if finish_reason:
                attrs["gen_ai.response.finish_reasons"] = (str(finish_reason),)
            span_status = _UNSET
            if error_class is not None or status >= 500:
                attrs["error.type"] = error_class or str(status)
                span_status = _ERROR
            if self.capture_content:
                if conversation:
                    attrs["gen_ai.input.messages"] = orjson.dumps(
                        [_message_parts(m) for m in conversation if isinstance(m, dict)]
                    ).decode()
                message = reply.get("message")
                if isinstance(message, dict):
                    out = _message_parts(message)
                    if finish_reason:
                        out["finish_reason"] = finish_reason
                    attrs["gen_ai.output.messages"] = orjson.dumps([out]).decode()
            span = ReadableSpan(
                f"{op} {model}", self._context(ct), ct.parent, self.resource, attrs,
                kind=SpanKind.CLIENT, status=span_status, start_time=ct.start_ns,
                end_time=time.time_ns(), instrumentation_scope=_SCOPE,
            )
            self.processor.on_end(span)
        except Exception:  # telemetry never fails a call
            log.debug("span end failed", exc_info=True)

    def shutdown(self) -> None:
        if self.processor is not None:
            try:
                self.processor.shutdown()
            except Exception:
                log.warning("tracing shutdown failed", exc_info=True)


def _message_parts(message: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI-style message in the GenAI conventions' shape: role and typed parts."""
    role = message.get("role") or "user"
    parts: list[dict[str, Any]] = []
    content = message.get("content")
    if role == "tool":
        parts.append({"type": "tool_call_response", "id": message.get("tool_call_id"),
                      "response": content})
    elif isinstance(content, str):
        parts.append({"type": "text", "content": content})
    elif isinstance(content, list):
        for item in content:
            if isinstance(item, dict) and isinstance(item.get("text"), str):
                parts.append({"type": "text", "content": item["text"]})
            elif isinstance(item, dict):
                parts.append({"type": str(item.get("type", "unknown"))})
    for tc in message.get("tool_calls") or ():
        if isinstance(tc, dict):
            fn = tc.get("function")
            if not isinstance(fn, dict):
                fn = {}
            parts.append({"type": "tool_call", "id": tc.get("id"), "name": fn.get("name"),
                          "arguments": fn.get("arguments")})
    return {"role": role, "parts": parts}
