"""A model call's upstream leg: its request sent (aiohttp, or the litellm adapter) and the
answer relayed to the client, streams event by event as they arrive."""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple

import aiohttp

from budgetproxy.config import UpstreamConfig
from budgetproxy.core.forwarded_headers import HeaderPolicy
from budgetproxy.errors import ProxyError, upstream_redirect
from budgetproxy.proxy.asgi import Receive, Send
from budgetproxy.proxy.calls import ModelCall
from budgetproxy.proxy.capture import Tokens, strip_body, strip_event
from budgetproxy.proxy.h1 import UpstreamProtocolError
from budgetproxy.proxy.outcome import ANSWERED, Outcome, answered, failed, stream_ended
from budgetproxy.proxy.relay import StreamEnd, relay_stream
from budgetproxy.proxy.sse import EventSplitter
from budgetproxy.proxy.upstream import UpstreamPool, UpstreamResponse
from budgetproxy.proxy.wire import DROP_RESPONSE_HEADERS
from budgetproxy.telemetry.metrics import Metrics
from budgetproxy.telemetry.tracing import Tracing


class Leg(NamedTuple):
    """What a call's upstream leg came to, as `UpstreamCall` returns it (forward.py keeps it on
    the call, then settles and records the call from it)."""

    outcome: Outcome
    started: bool = False  # the answer's head was sent (a whole answer's: is being sent)
    sent_body: bool = False  # some of its body reached the client (or is being sent)
    t_upstream: float = 0.0  # seconds from the request to the answer's end
    data: bytes | None = None  # a whole answer (as the client got it when capture read it)
    events: list[bytes] | None = None  # a stream's events, dropped ones included
    tokens: Tokens | None = None  # what it sampled, read as capture stripped the answer
    answer: Any = None  # the answer parsed, when capture stripped it
    error: ProxyError | None = None  # the error to answer with (no head was sent)
    # A whole answer is returned unsent: its head (the upstream's headers; the X-Episode-*
    # ones are added when it is sent, settlement.py `Settlement.conclude`) and the bytes the
    # client gets. None: nothing left to send (a stream, relayed as it came, or an error).
    head: list[tuple[bytes, bytes]] | None = None
    body: bytes = b""


class UpstreamCall:
    """Sends model calls upstream and relays streams; what a call comes to on the way is the
    `Leg` it returns, a whole answer's unsent. The leg calls nothing back."""

    def __init__(
        self, pool: UpstreamPool, metrics: Metrics | None, tracing: Tracing,
        litellm_call: Callable[..., Any] | None, *, header_policy: HeaderPolicy,
        own_keys: bool,
    ) -> None:
        self.pool = pool
        self.metrics = metrics
        self.tracing = tracing
        self.litellm_call = litellm_call
        self.header_policy = header_policy
        self.own_keys = own_keys  # the proxy checks keys of its own: never sent upstream

    async def http(
        self, call: ModelCall, upstream: UpstreamConfig, headers: dict[bytes, bytes], body: bytes,
        receive: Receive, send: Send, drop_usage: bool,
        episode_head: list[tuple[bytes, bytes]] | None,
    ) -> Leg:
        """The call sent upstream. A stream is relayed to the client as it arrives, its head
        carrying `episode_head` (the X-Episode-* headers, given for a stream); a whole answer
        is read and returned unsent."""
        t_up = time.perf_counter()
        try:
            out_headers = self.request_headers(headers, upstream, call)
            self.tracing.inject(call.span, out_headers)
            resp = await self.pool.post(upstream, call.route, call.query, out_headers, body)
        except (aiohttp.ClientError, OSError, ValueError) as e:  # (TimeoutError is an OSError)
            return self._unanswered(upstream, e, t_up)
        try:
            status = resp.status
            if not 200 <= status <= 599:  # (aiohttp reads any three digits)
                return self._failed(upstream, "protocol", t_up, ProxyError(
                    502, "upstream_error", f"Upstream {upstream.name!r} answered status "
                    f"{status}, which HTTP does not allow here"))
            if 300 <= status < 400:
                return self._failed(upstream, "redirect", t_up,
                                    upstream_redirect(upstream.name, status))
            ctype = resp.header("content-type") or ""
            if call.stream and status == 200 and ctype.startswith("text/event-stream"):
                return await self._relay_stream(call, upstream, resp, receive, send,
                                                drop_usage, t_up, episode_head or [])
            try:
                data = await resp.read()
            except (aiohttp.ClientError, OSError) as e:  # (its record says the status here)
                return self._unanswered(upstream, e, t_up, " mid-response")
            t_upstream = time.perf_counter() - t_up
            cap = call.capture
            sent, tokens, answer = data, None, None
            if cap is not None and cap.strips and status == 200:
                sent, tokens, answer = strip_body(data, cap)
            # (tokens read on the way: the reply is read from the smaller body the client got)
            # Known before the head: its remaining-budget headers read the usage in it.
            # (ANSWERED: `answered`'s own for a 200, without the call)
            leg = Leg(ANSWERED if status == 200 else answered(status), True, True, t_upstream,
                      sent if tokens is not None else data, None, tokens, answer, None,
                      self._response_headers(resp), sent)
        finally:
            resp.release()
        self._observe_upstream(upstream, leg)
        return leg

    async def litellm(
        self, call: ModelCall, upstream: UpstreamConfig, payload: dict[str, Any]
    ) -> Leg:
        if self.litellm_call is None:
            raise ProxyError(500, "litellm_unavailable", "litellm upstream is not set up")
        t = time.perf_counter()
        status, data = await self.litellm_call(upstream, payload, call.stream)
        body, events = (None, EventSplitter().feed(data)) if call.stream else (data, None)
        ctype = b"text/event-stream" if call.stream and status == 200 else b"application/json"
        # (returned unsent, as a whole answer on the HTTP path)
        leg = Leg(answered(status), True, True, time.perf_counter() - t, body, events,
                  head=[(b"content-type", ctype)], body=data)
        self._observe_upstream(upstream, leg)
        return leg

    def request_headers(
        self, headers: dict[bytes, bytes], upstream: UpstreamConfig, call: ModelCall
    ) -> dict[str, str]:
        out = self.header_policy.selected(headers)
        out["content-type"] = "application/json"
        if upstream.api_key:  # where the call's API carries it (Messages: x-api-key)
            name, value = call.dialect.upstream_key_header(upstream.api_key)
            out[name] = value
        elif not self.own_keys:
            auth = headers.get(b"authorization")
            if auth and not auth.startswith(b"Bearer bpk."):  # an episode key stays here
                out["authorization"] = auth.decode("latin-1")
            key = headers.get(b"x-api-key")
            if key:
                out["x-api-key"] = key.decode("latin-1")
        return out

    async def _relay_stream(
        self, call: ModelCall, upstream: UpstreamConfig, resp: UpstreamResponse,
        receive: Receive, send: Send, drop_usage: bool, t_up: float,
        episode_head: list[tuple[bytes, bytes]],
    ) -> Leg:
        head = self._response_headers(resp)
        head.extend(episode_head)
        cap = call.capture
        transform = partial(strip_event, cap=cap) if cap is not None and cap.strips else None
        relayed = await relay_stream(resp, receive, send, head, drop_usage=drop_usage,
                                     ends=call.dialect.ends_stream, transform=transform)
        end = relayed.end
        broke_early = end is StreamEnd.BROKEN and not relayed.started
        # (ANSWERED: `stream_ended`'s own for a whole stream, without the call)
        leg = Leg(ANSWERED if end is StreamEnd.COMPLETE
                  else stream_ended(end, relayed.started, relayed.sent_body),
                  relayed.started, relayed.sent_body, time.perf_counter() - t_up,
                  events=relayed.events,
                  error=ProxyError(502, "upstream_unreachable",
                                   "Upstream stream ended before sending any data")
                  if broke_early else None)
        self._observe_upstream(upstream, leg)
        m = self.metrics
        if relayed.first_sent_at is not None and m is not None:
            m.child(m.ttft, m.model_label(call.model)).observe(relayed.first_sent_at - call.t0)
        return leg

    @staticmethod
    def _response_headers(resp: UpstreamResponse) -> list[tuple[bytes, bytes]]:
        out = []  # (a loop, not a comprehension: no frame of its own)
        for k, v in resp.headers:
            if k not in DROP_RESPONSE_HEADERS:
                out.append((k.encode("latin-1"), v.encode("latin-1")))
        return out

    def _unanswered(
        self, upstream: UpstreamConfig, e: Exception, t_up: float, when: str = ""
    ) -> Leg:
        """The upstream sent no answer (or broke off reading it, `when` mid-response): timed
        out, a protocol error (before the answer only), or unreachable."""
        name = upstream.name
        if isinstance(e, TimeoutError | aiohttp.ServerTimeoutError):
            return self._failed(upstream, "timeout", t_up, ProxyError(
                504, "upstream_timeout", f"Upstream {name!r} timed out{when}"))
        if isinstance(e, UpstreamProtocolError) and not when:
            return self._failed(upstream, "protocol", t_up, ProxyError(
                502, "upstream_error", f"Upstream {name!r} answered badly: {e}"))
        return self._failed(upstream, "connect", t_up, ProxyError(
            502, "upstream_unreachable", f"Upstream {name!r} "
            + (f"failed{when}" if when else f"is unreachable: {e}")))

    def _failed(
        self, upstream: UpstreamConfig, cls: str, t_up: float, error: ProxyError
    ) -> Leg:
        """No answer to relay: `error` is the client's, the turn given back."""
        leg = Leg(failed(cls), t_upstream=time.perf_counter() - t_up, error=error)
        self._observe_upstream(upstream, leg)
        return leg

    def _observe_upstream(self, upstream: UpstreamConfig, leg: Leg) -> None:
        m = self.metrics
        if m is None:
            return
        m.child(m.upstream_duration, upstream.name).observe(leg.t_upstream)
        error_class = leg.outcome.error_class
        if error_class is not None:
            m.upstream_errors.labels(upstream.name, error_class).inc()
