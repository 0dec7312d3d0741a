"""Connection limits the HTTP server enforces before a request reaches the app: header size
and count (431), header and body read deadlines (408), and connection caps (503)."""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass
from typing import Any

import httptools
import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from budgetproxy.errors import ProxyError

# uvicorn's internals BoundedProtocol builds on: the names it uses of its parent protocol and
# of the protocol's request cycle, none of them uvicorn's public API. pyproject bounds uvicorn
# to the releases tested with them; tests/serve/test_http_limits.py checks that each exists
# and that this module uses no other.
UVICORN_PROTOCOL_NAMES = (
    "connection_made", "connection_lost", "data_received", "on_headers_complete",
    "on_message_complete", "_unset_keepalive_if_required", "_should_upgrade",
    "handle_websocket_upgrade", "_unsupported_upgrade_warning",
    "loop", "parser", "transport", "connections", "client", "cycle", "headers", "url",
)
UVICORN_CYCLE_NAMES = (
    "transport", "more_body", "response_started", "response_complete", "disconnected",
    "message_event",
)


@dataclass(frozen=True, slots=True)
class HttpLimits:
    max_header_bytes: int
    max_headers: int
    header_timeout_s: float
    body_timeout_s: float
    max_connections: int
    max_connections_per_client: int | None


class _Refused(Exception):
    """Raised inside a parser callback to stop parsing a request the limits refuse."""

    def __init__(self, error: ProxyError) -> None:
        super().__init__(error.message)
        self.error = error


def too_large_head(limits: HttpLimits) -> ProxyError:
    return ProxyError(431, "request_header_fields_too_large",
                      f"Request headers exceed {limits.max_header_bytes} bytes or "
                      f"{limits.max_headers} fields (server.max_header_bytes, "
                      "server.max_headers)", type_="invalid_request_error")


def _timed_out(what: str, key: str) -> ProxyError:
    return ProxyError(408, "request_timeout", f"The request's {what} did not arrive in time "
                      f"({key})", type_="invalid_request_error")


def _over_cap(key: str) -> ProxyError:
    return ProxyError(503, "too_many_connections", f"Too many open connections ({key}); "
                      "retry shortly", type_="service_unavailable")


class BoundedConfig(uvicorn.Config):
    """uvicorn's settings, with the limits BoundedProtocol enforces and the count of open
    connections per client address it keeps (one per server; pickled to worker processes
    with the rest, so each worker counts its own)."""

    def __init__(self, app: Any, *, limits: HttpLimits, **kwargs: Any) -> None:
        super().__init__(app, http=BoundedProtocol, **kwargs)
        self.http_limits = limits
        self.per_client: Counter[str] = Counter()


class HeadWithBody:
    """What a request's cycle writes through: a response head waits for the write that
    follows it (the body, or a stream's first event, sent at once after it) and both leave in
    one send, one system call and one packet instead of two; a head nothing follows within the
    event loop's iteration goes out alone at its end.

    Measured alone, a server's CPU per whole answer falls to about 0.72x of two writes' (11.4
    against 15.8 us, `python bench/head_coalescing.py`, bench/README.md's history)."""

    __slots__ = ("transport", "loop", "_head")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self.transport = transport
        self.loop = loop
        self._head: bytes | None = None

    def write(self, data: bytes) -> None:
        head = self._head
        if head is not None:
            self._head = None
            self.transport.write(head + data)
        elif data.startswith(b"HTTP/1.1 ") and data.endswith(b"\r\n\r\n"):
            self._head = data
            self.loop.call_soon(self.flush)
        else:
            self.transport.write(data)

    def flush(self) -> None:
        head = self._head
        if head is not None:
            self._head = None
            if not self.transport.is_closing():
                self.transport.write(head)

    def close(self) -> None:
        self.flush()
        self.transport.close()

    def is_closing(self) -> bool:
        return self.transport.is_closing()


class BoundedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a BoundedConfig's limits enforced."""

    def __init__(self, config: BoundedConfig, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, *args, **kwargs)
        self.limits = config.http_limits
        self.per_client = config.per_client
        self._head_bytes = 0  # bytes received since the current request began
        self._in_head = True
        self._refusal: ProxyError | None = None  # answered once the head is read
        self._deadline: asyncio.TimerHandle | None = None
        self._client_key: str | None = None

    # -- connections -----------------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._writer = HeadWithBody(transport, self.loop)
        if len(self.connections) > self.limits.max_connections:
            self._refusal = _over_cap("server.max_connections")
        cap = self.limits.max_connections_per_client
        if cap is not None and self.client is not None:
            self._client_key = self.client[0]
            self.per_client[self._client_key] += 1
            if self.per_client[self._client_key] > cap:
                self._refusal = _over_cap("server.max_connections_per_client")
        self._arm(self.limits.header_timeout_s, self._head_timed_out)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        # uvicorn cancels its keep-alive timer only on a clean close; after a reset the
        # pending timer would hold this closed connection for timeout_keep_alive seconds.
        self._unset_keepalive_if_required()
        if self._client_key is not None:
            self.per_client[self._client_key] -= 1
            if self.per_client[self._client_key] <= 0:
                del self.per_client[self._client_key]
            self._client_key = None
        super().connection_lost(exc)

    # -- parsing ---------------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        self._unset_keepalive_if_required()
        if self._in_head:
            self._head_bytes += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as e:
            if isinstance(e.__context__, _Refused):
                self._answer(e.__context__.error)
                return
            self._bad_request()
            return
        except httptools.HttpParserUpgrade:  # as uvicorn's own protocol handles it
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return
        except httptools.HttpParserError:
            self._bad_request()
            return
        if self._in_head:
            if self._head_bytes > self.limits.max_header_bytes:
                # a head still incomplete past the limit: refused before it grows further
                self._answer(too_large_head(self.limits))
            elif self._deadline is None and self._head_bytes:
                self._arm(self.limits.header_timeout_s, self._head_timed_out)
        elif self._deadline is None and self.cycle is not None and self.cycle.more_body:
            self._arm(self.limits.body_timeout_s, self._body_timed_out)

    # Timers are armed only for what is still incomplete after a read (a head or a body
    # split across packets), never for a request that arrives whole: the usual request
    # costs no timer, and its size and field count are checked once, when its head is done.
    def on_headers_complete(self) -> None:
        if self._deadline is not None:
            self._disarm()
        self._in_head = False
        if self._refusal is not None:
            raise _Refused(self._refusal)
        if len(self.headers) > self.limits.max_headers or (
                self._head_bytes > self.limits.max_header_bytes and  # (a read holds more)
                len(self.url) + sum(len(n) + len(v) + 4 for n, v in self.headers)
                > self.limits.max_header_bytes):
            raise _Refused(too_large_head(self.limits))
        super().on_headers_complete()
        if self.cycle is not None:
            self.cycle.transport = self._writer  # type: ignore[assignment]

    def on_message_complete(self) -> None:
        if self._deadline is not None:
            self._disarm()
        self._head_bytes = 0
        self._in_head = True
        super().on_message_complete()

    # -- answers ---------------------------------------------------------------------------
    def _arm(self, delay: float, callback: Any) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(delay, callback)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _head_timed_out(self) -> None:
        self._deadline = None
        if self._head_bytes:
            self._answer(_timed_out("headers", "server.header_timeout_s"))
        elif not self.transport.is_closing():
            self.transport.close()  # nothing sent at all: no request to answer

    def _body_timed_out(self) -> None:
        self._deadline = None
        cycle = self.cycle
        if cycle is None or cycle.response_started:
            self.transport.close()
            return
        self._answer(_timed_out("body", "server.body_timeout_s"))

    def _answer(self, error: ProxyError) -> None:
        """Answer `error` on the wire and close; an app still reading the request gets
        a disconnect, and anything it sends later goes nowhere."""
        self._disarm()
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            if cycle.response_started:
                self.transport.close()
                return
            cycle.disconnected = True
            cycle.message_event.set()
        if self.transport.is_closing():
            return
        body = error.body()
        head = [b"HTTP/1.1 %d %s\r\n" % (error.status, _reason(error.status))]
        head.extend(b"%s: %s\r\n" % kv for kv in error.header_list())
        head.append(b"content-length: %d\r\nconnection: close\r\n\r\n" % len(body))
        self.transport.write(b"".join(head) + body)
        self.transport.close()

    def _bad_request(self) -> None:
        self._answer(ProxyError(400, "invalid_request", "Invalid HTTP request"))


def _reason(status: int) -> bytes:
    return {400: b"Bad Request", 408: b"Request Timeout", 431: b"Request Header Fields Too Large",
            503: b"Service Unavailable"}.get(status, b"")
