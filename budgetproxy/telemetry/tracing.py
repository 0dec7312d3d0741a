"""OpenTelemetry tracing: one span per model call, GenAI conventions, never failing a call.

Spans are not made through the SDK's Tracer on the hot path: that, with the SDK's OTLP
encoder, added 60-90% to a call's CPU time. When a call starts, the proxy draws the span's ids
and asks the configured sampler (`OTEL_TRACES_SAMPLER`), continuing the agent's trace when its
request carried a W3C `traceparent`, so the upstream request carries this span's context;
an episode's calls that start traces share their trace ids' low 64 bits, so a ratio sampler
keeps or drops a whole episode.
When the call has finished, its span's values are kept: for the proxy's own exporter
(`otlp_export.py`) its export thread encodes them straight to OTLP bytes with the rest of the batch;
for whatever span processor the embedding code passes to `BudgetProxy`, an SDK `ReadableSpan`
is built at once. Both carry the same attributes in the same order; the tests compare them
byte for byte. Unsampled calls build nothing.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import random
import time
from collections.abc import Callable
from typing import Any

import orjson
from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.sampling import Decision, Sampler, TraceIdRatioBased
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import (
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    TraceFlags,
    TraceState,
)

from budgetproxy import __version__
from budgetproxy.config import TracingConfig, UpstreamConfig
from budgetproxy.core.episode import EpisodeState, Grant
from budgetproxy.core.usage import token_counts
from budgetproxy.telemetry.otlp import SpanEncoder, span_message, status_field
from budgetproxy.telemetry.otlp_export import OtlpBatchProcessor, build_exporter
from budgetproxy.telemetry.span_attrs import (
    ERROR,
    OPERATION,
    UNSET,
    episode_attrs,
    error_type_of,
    finish_reason_attr,
    message_parts,
    outcome_attrs,
    span_parts,
    upstream_attrs,
)

log = logging.getLogger("budgetproxy.telemetry.tracing")

_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_HEX = frozenset("0123456789abcdef")
_SCOPE = InstrumentationScope("budgetproxy", __version__)
_LOW_64 = (1 << 64) - 1


def tracing_wanted(cfg: TracingConfig) -> bool:
    if cfg.enabled is not None:
        return cfg.enabled
    return bool(
        os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )


def build_processor(on_count: Callable[[str, int], None] | None = None) -> SpanProcessor | None:
    """Batches exported over OTLP/HTTP, configured by the standard OTEL_* variables;
    `on_count(result, n)` hears of spans exported, failed and dropped."""
    try:
        exporter = build_exporter()
    except ImportError:
        log.warning("tracing is on but the OTLP exporter is not installed: "
                    "pip install 'budgetproxy[otlp]'")
        return None
    return OtlpBatchProcessor(exporter, on_count)


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
    # W3C asks that at least 512 characters of tracestate be kept; past 4 KB it is dropped
    # unread (the SDK would log the whole of it as invalid).
    if state and len(state) <= 4096:
        try:
            trace_state = TraceState.from_header([state.decode("latin-1")])
        except Exception:
            trace_state = None
    return SpanContext(trace_id, span_id, is_remote=True,
                       trace_flags=TraceFlags(int(parts[3], 16) & 0x01),
                       trace_state=trace_state)


class CallTrace:
    """The trace context of one model call, drawn when it starts, and once it has finished,
    what its span needs, kept as plain values until its batch is encoded."""

    __slots__ = ("trace_id", "span_id", "parent", "sampled", "start_ns", "end_ns", "resource",
                 "call")
    scope = _SCOPE
    # Set by Tracing.finish: the end, and the values span_parts() takes.
    end_ns: int
    resource: Resource
    call: tuple[Any, ...]

    def __init__(self, trace_id: int, span_id: int, parent: SpanContext | None,
                 sampled: bool) -> None:
        self.trace_id = trace_id
        self.span_id = span_id
        self.parent = parent
        self.sampled = sampled
        self.start_ns = time.time_ns()

    def traceparent(self) -> str:
        # %-formatting: half the time of an f-string's format specs on a 128-bit int.
        return "00-%032x-%016x-%s" % (self.trace_id, self.span_id,  # noqa: UP031
                                      "01" if self.sampled else "00")

    def encode(self, enc: SpanEncoder) -> bytes:
        """The finished call's Span message (see OtlpBatchProcessor.defer). Built from parts
        cached under the values that fix them: what the upstream, model and episode fix, and
        the call's small values; only ids, times and token counts are encoded per span."""
        (kind, model, upstream, episode_id, episode, remaining, grant, status, error_class,
         usage, finish_reason, content) = self.call
        fixed_key = (_FIXED, kind, model, upstream.name, upstream.kind, upstream.base_url,
                     episode_id, episode)
        fixed = enc.recall(fixed_key)
        if fixed is None:
            op = OPERATION.get(kind, kind)
            fixed = enc.remember(fixed_key, (
                enc.head(f"{op} {model}", SpanKind.CLIENT),
                enc.attributes(b"\x4a", {
                    **upstream_attrs(op, model, upstream.name, upstream.kind, upstream.base_url),
                    **(episode_attrs(episode_id) if episode is None
                       else episode_attrs(episode_id, *episode))}),
            ))
        reason = finish_reason_attr(finish_reason)
        outcome_key = (_OUTCOME, status, remaining, grant, reason, error_class)
        outcome = enc.recall(outcome_key)
        if outcome is None:
            error_type = error_type_of(status, error_class)
            outcome = enc.remember(outcome_key, (
                enc.attributes(b"\x4a", outcome_attrs(status, remaining, grant, reason,
                                                         error_type)),
                status_field(UNSET if error_type is None else ERROR),
            ))
        attrs = [fixed[1], outcome[0]]
        tin, tout = token_counts(usage)
        if tin is not None:
            attrs.append(enc.int_attribute("gen_ai.usage.input_tokens", tin))
        if tout is not None:
            attrs.append(enc.int_attribute("gen_ai.usage.output_tokens", tout))
        if content:
            attrs.append(enc.attributes(b"\x4a", content))
        parent = self.parent
        if parent is not None and parent.trace_state:
            return enc.fields(self.trace_id, self.span_id, parent.trace_state, parent,
                              f"{OPERATION.get(kind, kind)} {model}", SpanKind.CLIENT,
                              self.start_ns, self.end_ns, b"".join(attrs),
                              UNSET if error_type_of(status, error_class) is None else ERROR)
        return span_message(self.trace_id, self.span_id, parent, fixed[0], self.start_ns,
                            self.end_ns, b"".join(attrs), outcome[1])


# Distinct first elements of CallTrace.encode's cache keys.
_FIXED, _OUTCOME = object(), object()


class Tracing:
    """Model-call spans; a None processor makes every call a no-op."""

    def __init__(
        self, processor: SpanProcessor | None, *, resource: Resource | None = None,
        sampler: Sampler | None = None, capture_content: bool = False,
    ) -> None:
        self.processor = processor
        self.capture_content = capture_content
        self.resource = resource or Resource.get_empty()
        self.sampler = sampler
        # The standard samplers, decided here without a call into the SDK: a root span is
        # sampled when the low 64 bits of its trace id are below the bound (TraceIdRatioBased's
        # rule); `parentbased_*` follow a remote parent's sampled flag. None: ask the sampler.
        self._bound: int | None = None
        self._parent_based = False
        # Spans for our own OTLP processor are queued as values, without a ReadableSpan.
        self._direct = (processor if isinstance(processor, OtlpBatchProcessor)
                        and processor.takes_pending else None)
        propagators = os.environ.get("OTEL_PROPAGATORS", "tracecontext,baggage")
        # W3C trace context is read and written directly; other propagators go through the API.
        self._w3c = {p.strip() for p in propagators.split(",")} <= {"tracecontext", "baggage"}
        if processor is None:
            return
        if resource is None:
            # Resource.create adds the SDK's attributes and OTEL_RESOURCE_ATTRIBUTES.
            self.resource = Resource.create(
                {"service.name": os.environ.get("OTEL_SERVICE_NAME", "budgetproxy")})
        if sampler is None:
            # The SDK reads OTEL_TRACES_SAMPLER / _ARG when it makes a provider.
            self.sampler = TracerProvider(shutdown_on_exit=False).sampler
            self._standard_sampler()

    def _standard_sampler(self) -> None:
        name = os.environ.get("OTEL_TRACES_SAMPLER", "parentbased_always_on").strip().lower()
        base = name.removeprefix("parentbased_")
        if base == "always_on":
            self._bound = _LOW_64 + 1
        elif base == "always_off":
            self._bound = 0
        elif base == "traceidratio":
            try:
                rate = float(os.environ.get("OTEL_TRACES_SAMPLER_ARG", "1.0"))
            except ValueError:
                rate = 1.0  # as the SDK does
            if not 0.0 <= rate <= 1.0:
                rate = 1.0
            self._bound = TraceIdRatioBased.get_bound_for_rate(rate)
        else:
            return
        self._parent_based = name != base

    @property
    def enabled(self) -> bool:
        return self.processor is not None

    def start(self, kind: str, model: str | None, headers: dict[bytes, bytes],
              episode_id: str | None = None) -> CallTrace | None:
        """Draw this call's span context; None when tracing is off or fails.

        A call that starts a trace in an episode gets a trace id whose low 64 bits are the
        episode's (a hash of its id) and whose high 64 bits are random: ids stay unique, and
        ratio samplers, which decide on those low bits (ours, the SDK's, and any downstream
        service's), take or leave an episode's calls together."""
        if self.processor is None:
            return None
        try:
            parent = self._parent(headers)
            if parent is not None:
                trace_id = parent.trace_id
            elif episode_id is not None:
                trace_id = (random.getrandbits(64) << 64 | _episode_bits(episode_id)) or 1
            else:
                trace_id = random.getrandbits(128) or 1
            if self._bound is not None:
                if parent is not None and self._parent_based:
                    sampled = parent.trace_flags.sampled
                else:
                    sampled = (trace_id & _LOW_64) < self._bound
            else:
                ctx = (trace.set_span_in_context(NonRecordingSpan(parent)) if parent is not None
                       else Context())
                name = f"{OPERATION.get(kind, kind)} {model}"
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
        conversation: list[Any] | None = None, charged: bool | None = None,
        remaining: int | None = None,
    ) -> None:
        """Hand the finished call's span to the processor, if it was sampled. For the proxy's
        own exporter only values are kept here; the batch is encoded on the export thread.
        `charged` and `remaining` are the turn's once settled (a refund changes both); by
        default the grant's and the episode state's."""
        if ct is None or not ct.sampled or self.processor is None:
            return
        try:
            end_ns = time.time_ns()
            finish_reason = reply.get("finish_reason")
            content = (self._content(conversation, reply, finish_reason)
                       if self.capture_content else None)
            # Values now, not the episode state or the grant: they belong to the episode,
            # which moves on while the span waits for its batch. (The usage dict is the
            # parsed reply's, which nothing changes after the call.)
            call = (kind, model, upstream, episode_id,
                    None if state is None else (state.budget, state.disclosure, state.task_id),
                    remaining if remaining is not None or state is None else state.remaining,
                    None if grant is None else (
                        grant.turn, grant.attempt, grant.charged if charged is None else charged),
                    status, error_class, reply.get("usage"), finish_reason, content)
            direct = self._direct
            if direct is not None:
                ct.end_ns = end_ns
                ct.resource = self.resource
                ct.call = call
                direct.defer(ct)
                return
            name, call_key, episode_key, outcome_key, extra, span_status = span_parts(*call)
            span = ReadableSpan(
                name, self._context(ct), ct.parent, self.resource,
                {**upstream_attrs(*call_key), **episode_attrs(*episode_key),
                 **outcome_attrs(*outcome_key), **extra},
                kind=SpanKind.CLIENT,
                status=span_status, start_time=ct.start_ns, end_time=end_ns,
                instrumentation_scope=_SCOPE,
            )
            self.processor.on_end(span)
        except Exception:  # telemetry never fails a call
            log.debug("span end failed", exc_info=True)

    @staticmethod
    def _content(conversation: list[Any] | None, reply: dict[str, Any],
                 finish_reason: Any) -> dict[str, Any]:
        attrs: dict[str, Any] = {}
        if conversation:
            attrs["gen_ai.input.messages"] = orjson.dumps(
                [message_parts(m) for m in conversation if isinstance(m, dict)]
            ).decode()
        message = reply.get("message")
        if isinstance(message, dict):
            out = message_parts(message)
            if finish_reason:
                out["finish_reason"] = finish_reason
            attrs["gen_ai.output.messages"] = orjson.dumps([out]).decode()
        return attrs

    def shutdown(self) -> None:
        if self.processor is not None:
            try:
                self.processor.shutdown()
            except Exception:
                log.warning("tracing shutdown failed", exc_info=True)


@functools.lru_cache(maxsize=4096)
def _episode_bits(episode_id: str) -> int:
    """64 bits fixed by an episode id, the same on every replica and after restarts."""
    return int.from_bytes(hashlib.blake2b(episode_id.encode(), digest_size=8).digest(), "big")

