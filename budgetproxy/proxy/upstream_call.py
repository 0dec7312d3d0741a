"""A model call's upstream leg: its request sent (aiohttp, or the litellm adapter) and the
answer relayed to the client, streams event by event as they arrive."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import aiohttp

from budgetproxy.config import UpstreamConfig
from budgetproxy.core.episode import SettleResult
from budgetproxy.core.forwarded_headers import HeaderPolicy
from budgetproxy.errors import ProxyError, upstream_redirect
from budgetproxy.proxy.asgi import Receive, Send, send_response
from budgetproxy.proxy.calls import ModelCall
from budgetproxy.proxy.capture import strip_body, strip_event
from budgetproxy.proxy.h1 import UpstreamProtocolError
from budgetproxy.proxy.relay import StreamEnd, relay_stream
from budgetproxy.proxy.sse import EventSplitter
from budgetproxy.proxy.upstream import UpstreamPool, UpstreamResponse
from budgetproxy.proxy.wire import DROP_RESPONSE_HEADERS
from budgetproxy.telemetry.metrics import Metrics
from budgetproxy.telemetry.tracing import Tracing


class UpstreamCall:
    """Sends model calls upstream and relays the answers; what a call learns on the way (its
    status, upstream time, failure class, the events or body it got) is left on its ModelCall.

    `episode_headers(call)` are the X-Episode-* headers its answer carries; `settle(call)`
    settles its turn, which a refundable answer does before the client has it (a retry the
    client sends at once must find the turn given back)."""

    def __init__(
        self, pool: UpstreamPool, metrics: Metrics | None, tracing: Tracing,
        litellm_call: Callable[..., Any] | None, *, header_policy: HeaderPolicy,
        own_keys: bool,
        episode_headers: Callable[[ModelCall], list[tuple[bytes, bytes]]],
        settle: Callable[[ModelCall], Awaitable[None]],
    ) -> None:
        self.pool = pool
        self.metrics = metrics
        self.tracing = tracing
        self.litellm_call = litellm_call
        self.header_policy = header_policy
        self.own_keys = own_keys  # the proxy checks keys of its own: never sent upstream
        self.episode_headers = episode_headers
        self.settle = settle

    async def http(
        self, call: ModelCall, upstream: UpstreamConfig, headers: dict[bytes, bytes], body: bytes,
        receive: Receive, send: Send, drop_usage: bool,
    ) -> None:
        t_up = time.perf_counter()
        try:
            out_headers = self.request_headers(headers, upstream, call)
            self.tracing.inject(call.span, out_headers)
            resp = await self.pool.post(upstream, call.route, call.query, out_headers, body)
        except (TimeoutError, aiohttp.ServerTimeoutError):
            self._fail(call, "timeout", t_up)
            raise ProxyError(504, "upstream_timeout",
                             f"Upstream {upstream.name!r} timed out") from None
        except UpstreamProtocolError as e:
            self._fail(call, "protocol", t_up)
            raise ProxyError(502, "upstream_error",
                             f"Upstream {upstream.name!r} answered badly: {e}") from None
        except (aiohttp.ClientError, OSError, ValueError) as e:
            self._fail(call, "connect", t_up)
            raise ProxyError(502, "upstream_unreachable",
                             f"Upstream {upstream.name!r} is unreachable: {e}") from None
        try:
            if not 200 <= resp.status <= 599:  # (aiohttp reads any three digits)
                self._fail(call, "protocol", t_up)
                raise ProxyError(502, "upstream_error", f"Upstream {upstream.name!r} answered "
                                 f"status {resp.status}, which HTTP does not allow here")
            if 300 <= resp.status < 400:
                self._fail(call, "redirect", t_up)
                raise upstream_redirect(upstream.name, resp.status)
            ctype = resp.header("content-type") or ""
            if call.stream and resp.status == 200 and ctype.startswith("text/event-stream"):
                await self._relay_stream(call, resp, receive, send, drop_usage, t_up)
                return
            try:
                data = await resp.read()
            except (TimeoutError, aiohttp.ClientError, OSError) as e:
                cls = "timeout" if isinstance(e, TimeoutError) else "connect"
                self._fail(call, cls, t_up)  # (its record says the status answered here)
                if cls == "timeout":
                    raise ProxyError(504, "upstream_timeout", f"Upstream {upstream.name!r} "
                                     "timed out mid-response") from None
                raise ProxyError(502, "upstream_unreachable",
                                 f"Upstream {upstream.name!r} failed mid-response") from None
            call.t_upstream = time.perf_counter() - t_up
            call.http_status = resp.status
            self._classify(call, resp.status)
            cap = call.capture
            sent = data
            if cap is not None and cap.strips and resp.status == 200:
                sent, call.tokens, call.answer = strip_body(data, cap)
            # (tokens read on the way: the reply is read from the smaller body the client got)
            # Set before the head: its remaining-budget headers read the usage in it.
            call.data = sent if call.tokens is not None else data
            out = self._response_headers(resp, call)
            call.started = True
            if call.result is SettleResult.REFUNDABLE:
                await self.settle(call)
            await send_response(send, resp.status, out, sent)
            call.sent_body = True
        finally:
            resp.release()
        self._observe_upstream(call)

    async def litellm(
        self, call: ModelCall, upstream: UpstreamConfig, payload: dict[str, Any], send: Send
    ) -> None:
        if self.litellm_call is None:
            raise ProxyError(500, "litellm_unavailable", "litellm upstream is not set up")
        t = time.perf_counter()
        status, data = await self.litellm_call(upstream, payload, call.stream)
        call.t_upstream = time.perf_counter() - t
        call.http_status = status
        self._classify(call, status)
        call.started = True
        ctype = b"text/event-stream" if call.stream and status == 200 else b"application/json"
        if call.stream:
            call.events = EventSplitter().feed(data)
        else:
            call.data = data  # (before the head, as on the HTTP path)
        await send_response(send, status, [(b"content-type", ctype),
                                           *self.episode_headers(call)], data)
        call.sent_body = True
        self._observe_upstream(call)

    def request_headers(
        self, headers: dict[bytes, bytes], upstream: UpstreamConfig, call: ModelCall
    ) -> dict[str, str]:
        out: dict[str, str] = {}
        forwarded = self.header_policy.forwarded
        for k, v in headers.items():
            if forwarded(k):
                out[k.decode("latin-1")] = v.decode("latin-1")
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
        self, call: ModelCall, resp: UpstreamResponse, receive: Receive, send: Send,
        drop_usage: bool, t_up: float,
    ) -> None:
        head = self._response_headers(resp, call)
        cap = call.capture
        transform = partial(strip_event, cap=cap) if cap is not None and cap.strips else None
        relayed = await relay_stream(resp, receive, send, head, drop_usage=drop_usage,
                                     ends=call.dialect.ends_stream, transform=transform)
        call.started = relayed.started
        call.sent_body = relayed.sent_body
        call.events = relayed.events
        call.t_upstream = time.perf_counter() - t_up
        if relayed.end is StreamEnd.CLIENT_GONE:
            # The client hung up: no upstream fault. What it had been sent is its status
            # (499, nginx's "client closed request", when not even the head went out).
            call.status = "client_closed"
            call.http_status = 200 if call.started else 499
            if not call.sent_body:
                call.result = SettleResult.REFUNDABLE
        elif relayed.end is StreamEnd.BROKEN:
            call.error_class = "stream_broken"
            call.status = "upstream_error"
            call.result = SettleResult.BROKEN if call.sent_body else SettleResult.REFUNDABLE
        self._observe_upstream(call)
        if relayed.end is StreamEnd.BROKEN and not call.started:
            call.http_status = 502
            raise ProxyError(502, "upstream_unreachable",
                             "Upstream stream ended before sending any data")
        if relayed.first_sent_at is not None and self.metrics is not None:
            call.ttft = relayed.first_sent_at - call.t0
            m = self.metrics
            m.child(m.ttft, m.model_label(call.model)).observe(call.ttft)

    def _response_headers(
        self, resp: UpstreamResponse, call: ModelCall
    ) -> list[tuple[bytes, bytes]]:
        out = [
            (k.encode("latin-1"), v.encode("latin-1"))
            for k, v in resp.headers
            if k not in DROP_RESPONSE_HEADERS
        ]
        out.extend(self.episode_headers(call))
        return out

    def _classify(self, call: ModelCall, status: int) -> None:
        if status == 429 or status >= 500:
            call.result = SettleResult.REFUNDABLE
            call.status = "upstream_error"
            call.error_class = "status_429" if status == 429 else "status_5xx"
        elif status >= 400:
            call.status = "upstream_error"
            call.error_class = "status_4xx"

    def _fail(self, call: ModelCall, cls: str, t_up: float) -> None:
        call.t_upstream = time.perf_counter() - t_up
        call.result = SettleResult.REFUNDABLE
        call.status = "upstream_error"
        call.error_class = cls
        call.http_status = 504 if cls == "timeout" else 502
        self._observe_upstream(call)

    def _observe_upstream(self, call: ModelCall) -> None:
        m = self.metrics
        if m is None or call.upstream is None:
            return
        m.child(m.upstream_duration, call.upstream.name).observe(call.t_upstream)
        if call.error_class is not None:
            m.upstream_errors.labels(call.upstream.name, call.error_class).inc()
