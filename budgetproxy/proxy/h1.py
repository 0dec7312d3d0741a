"""HTTP/1.1 to plain-HTTP upstreams: keep-alive connections per origin on asyncio protocols,
responses parsed by httptools (the parser uvicorn serves with).

Model calls go upstream through this client, not aiohttp's: aiohttp's request path (request
and response objects, multidicts, URL handling, stream readers, connector bookkeeping) costs
about 75 µs of CPU a call at concurrency 32 and this one about 24, 3.1x less
(`python bench/h1_client.py --rounds 3 --calls 10000` on a quiet machine; bench/README.md's
history has each run): most of what an episode's call costs over the bare forwarder. It does
only what a model call needs: POST one body with a content length, read a response with a
content length, chunked or ended by the connection's close, as a whole or as it arrives.
HTTPS upstreams and the passthrough routes keep aiohttp.

Timeouts are aiohttp's: `timeout_s` bounds the whole exchange (a stream included), and
`connect_timeout_s` a new connection. A connection that was idle in the pool and closes before
any byte of its answer arrives (the server dropped it as it was reused) is retried once on a
new connection: the one place a POST is sent twice, and only when no byte of an answer came
(docs/security.md). Every other failure is the caller's to map.

An answer must never reach a request it does not answer. HTTP/1.1 matches answers to requests
only by their order on a connection, so an upstream that writes more than one answer breaks
every later exchange on that connection. The rules that keep answers where they belong:

- A connection goes back to the pool only when its answer's framing is complete and nothing
  followed it in the same read. Any byte that arrives while a connection is idle, or after a
  complete answer, closes it.
- A kept connection is reused only after it has been quiet for `quiet_s` (and a poll of its
  socket finds nothing unread). A stray answer that comes within that time after the answer
  before it lands on an idle connection, where it is seen, instead of on the next request.
- Such a byte is proof that the upstream does not keep HTTP/1.1's order: the origin stops
  reusing connections for good (`Origin.desynced`, logged by the caller), so one answer per
  connection from then on and nothing can cross again.
- With `reuse=False` every request has a connection of its own (`connection: close`): the
  guarantee then holds whatever the upstream sends, at the cost of a connection per call.

What keep-alive cannot tell apart, no HTTP/1.1 client can: a stray answer written later than
`quiet_s` after the one before it, while the next request is already on that connection, is
read as that request's answer. `reuse=False` is the setting for an upstream not trusted that
far (docs/security.md gives the figures).
"""

from __future__ import annotations

import asyncio
import contextlib
import select
import socket
import time
import zlib
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import cast

import httptools

HIGH_WATER = 1 << 16  # unread bytes of a stream at which its connection stops reading
KEEPALIVE_S = 60.0  # an idle connection older than this is closed rather than reused
MAX_IDLE = 4096  # idle connections kept per origin; more are closed as they come back
QUIET_S = 0.25  # a kept connection is reused only after this long with no byte from upstream
CLOSE_WAIT_S = 5.0  # a connection: close answer the server does not close is closed here


class UpstreamDisconnected(ConnectionError):
    """The upstream closed the connection before its answer was whole."""


class UpstreamProtocolError(ConnectionError):
    """The upstream's bytes are not an HTTP/1.1 response this client reads."""


class Response:
    """One upstream answer. Its head is here when `Origin.post` returns; its body arrives on
    the connection's callbacks and is taken with `read()` or `iter_any()`. `release()` ends
    it: a connection whose answer was not read to the end is closed, never reused."""

    __slots__ = ("status", "headers", "_conn", "_chunks", "_size", "_complete", "_exc",
                 "_waiter", "_timer", "_decoder", "_close_delimited", "_streaming")

    def __init__(self) -> None:
        self.status = 0
        self.headers: list[tuple[str, str]] = []  # names lowercased, as received
        self._conn: _Connection | None = None
        self._chunks: list[bytes] = []
        self._size = 0
        self._complete = False
        self._exc: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._decoder: zlib._Decompress | None = None
        self._close_delimited = False
        self._streaming = False  # read part by part: a slow reader pauses the connection

    def header(self, name: str) -> str | None:
        """The first value of a header (`name` lowercase), or None."""
        for k, v in self.headers:
            if k == name:
                return v
        return None

    async def read(self) -> bytes:
        """The whole body."""
        while not self._complete:
            await self._wait()
        body = b"".join(self._chunks) if len(self._chunks) != 1 else self._chunks[0]
        self._chunks = []
        return body

    async def iter_any(self) -> AsyncIterator[bytes]:
        """The body's bytes as they arrive, each part once."""
        self._streaming = True
        while True:
            if self._chunks:
                data = b"".join(self._chunks) if len(self._chunks) != 1 else self._chunks[0]
                self._chunks = []
                self._size = 0
                conn = self._conn
                if conn is not None and conn.paused:
                    conn.resume()
                yield data
            elif self._complete:
                return
            else:
                await self._wait()

    def release(self) -> None:
        """Done with this answer: its connection goes back to the pool if the answer was read
        whole, else it is closed."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        conn = self._conn
        if conn is not None and not self._complete:
            self._conn = None
            conn.abort()

    async def _wait(self) -> None:
        if self._exc is not None:
            raise self._exc
        waiter = self._waiter = asyncio.get_running_loop().create_future()
        try:
            await waiter
        finally:
            self._waiter = None
        if self._exc is not None and not self._chunks:
            raise self._exc

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _feed(self, data: bytes) -> None:
        if self._decoder is not None:
            data = self._decoder.decompress(data)
            if not data:
                return
        self._chunks.append(data)
        self._size += len(data)
        self._wake()

    def _finish(self) -> None:
        if self._decoder is not None:
            rest = self._decoder.flush()
            if rest:
                self._chunks.append(rest)
        self._complete = True
        self._ended()

    def _fail(self, exc: BaseException) -> None:
        if self._complete or self._exc is not None:
            return
        self._exc = exc
        self._ended()

    def _ended(self) -> None:
        """Whole or failed: the connection and the deadline are no longer this answer's."""
        self._conn = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._wake()


class _Connection(asyncio.Protocol):
    """One keep-alive connection, carrying one request at a time."""

    def __init__(self, origin: Origin) -> None:
        self.origin = origin
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.resp: Response | None = None
        self.head: asyncio.Future[None] | None = None
        self.closed = False
        self.paused = False
        self.got_bytes = False
        self.interim = False  # parsing a 1xx answer, which another one follows
        self.idle_since = 0.0
        self.fd = -1
        self.closer: asyncio.TimerHandle | None = None
        self._raw: list[tuple[bytes, bytes]] = []

    # -- asyncio.Protocol ----------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # (uvloop's is not a subclass)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            self.fd = sock.fileno()
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        if self.resp is None:  # bytes no request asked for: nothing can be trusted after them
            self.origin.desync(self, "bytes arrived on a connection with no request in flight")
            return
        self.got_bytes = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:  # 101: no protocol switch was asked for
            self._failed(UpstreamProtocolError("upstream switched protocols (status 101), "
                                               "which no model call asks for"))
            self.abort()
        except httptools.HttpParserError as e:
            self._failed(UpstreamProtocolError(f"invalid HTTP response from upstream: {e}"))
            self.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.origin.forget(self)
        if self.closer is not None:
            self.closer.cancel()
            self.closer = None
        # The parser holds this protocol's callbacks and the transport holds the protocol:
        # cycles the collector would find only in its rare full passes, each holding the
        # connection's buffers until then. Cut here, a closed connection is freed now.
        self.transport = None
        del self.parser
        resp = self.resp
        self.resp = None
        if resp is None:
            return
        if resp.status and resp._close_delimited:  # its body is what came before the close
            resp._finish()
        else:
            self._failed(UpstreamDisconnected("upstream closed the connection before its "
                                              "answer was whole"), resp)

    # -- httptools callbacks -------------------------------------------------------------------
    def on_message_begin(self) -> None:
        if self.resp is None:  # an answer after the last one's end: nothing to trust after it
            self.origin.desync(self, "a second answer followed a complete one")
        self._raw = []

    def on_header(self, name: bytes, value: bytes) -> None:
        self._raw.append((name, value))

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        resp = self.resp
        if resp is None:
            return
        if status < 200:
            self.interim = True  # 100 Continue and friends: the real answer follows
            return
        if status > 599:  # (RFC 9110: three digits, 1xx-5xx; no server can pass it on)
            self._failed(UpstreamProtocolError(f"upstream answered status {status}, outside "
                                               "HTTP's 100-599"))
            self.abort()
            return
        resp.status = status
        headers = resp.headers = [(k.decode("latin-1").lower(), v.decode("latin-1"))
                                  for k, v in self._raw]
        framed = False
        for k, v in headers:
            if k == "content-length" or (k == "transfer-encoding" and "chunked" in v.lower()):
                framed = True
            elif k == "content-encoding":
                coding = v.strip().lower()
                if coding in ("gzip", "deflate", "x-gzip"):
                    resp._decoder = zlib.decompressobj(wbits=47)  # gzip or zlib, by header
                elif coding not in ("", "identity"):
                    self._failed(UpstreamProtocolError(
                        f"upstream answered with content-encoding {coding!r}, which the "
                        "proxy did not ask for and does not decode"))
                    self.abort()
                    return
        resp._close_delimited = not framed and status not in (204, 304)
        head = self.head
        if head is not None and not head.done():
            head.set_result(None)

    def on_body(self, body: bytes) -> None:
        resp = self.resp
        if resp is None or self.interim:
            return
        try:
            resp._feed(body)
        except zlib.error as e:
            self._failed(UpstreamProtocolError(f"upstream body does not decompress: {e}"))
            self.abort()
            return
        if (resp._streaming and resp._size >= HIGH_WATER and not self.paused
                and self.transport is not None):
            self.paused = True
            self.transport.pause_reading()

    def on_message_complete(self) -> None:
        if self.interim:
            self.interim = False
            return
        resp = self.resp
        self.resp = None
        if resp is not None:
            resp._finish()
        transport = self.transport
        if (self.parser.should_keep_alive() and not self.closed and transport is not None
                and not transport.get_write_buffer_size()  # (an early answer: body unsent)
                and self.origin.reuse):
            self.origin.idle(self)
        elif transport is not None and not self.closed and self.origin.reuse is False:
            # One answer per connection: the server closes it (its TIME_WAIT, not ours);
            # anything it sends first is dropped with it (data_received).
            self.origin.forget(self)
            self.closer = asyncio.get_running_loop().call_later(CLOSE_WAIT_S, self.abort)
        else:
            self.closed = True
            self.origin.forget(self)
            if transport is not None:
                transport.close()

    # -- the client's side ---------------------------------------------------------------------
    def send(self, data: bytes, resp: Response) -> asyncio.Future[None]:
        assert self.transport is not None
        self.resp = resp
        resp._conn = self
        self.got_bytes = False
        head = self.head = asyncio.get_running_loop().create_future()
        self.transport.write(data)
        return head

    def unread(self) -> bool:
        """Whether the socket holds bytes (or an end) that the event loop has not read."""
        fd = self.fd
        if fd < 0:
            return True
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        try:
            return bool(poller.poll(0))
        except OSError:
            return True

    def resume(self) -> None:
        self.paused = False
        if self.transport is not None and not self.closed:
            self.transport.resume_reading()

    def timed_out(self) -> None:
        self._failed(TimeoutError("upstream timed out"))
        self.abort()

    def abort(self) -> None:
        self.closed = True
        self.origin.forget(self)
        if self.transport is not None:
            self.transport.abort()

    def _failed(self, exc: BaseException, resp: Response | None = None) -> None:
        resp = resp or self.resp
        self.resp = None
        head = self.head
        if head is not None and not head.done():
            head.set_exception(exc)
        if resp is not None:
            resp._fail(exc)


class Origin:
    """Keep-alive connections to one host and port (plain HTTP); one request per connection
    at a time. A connection that comes back goes to `_cooling` until it has been quiet for
    `quiet_s`, then to `_ready`, from which the most recent is reused (the rules are in the
    module's docstring)."""

    def __init__(self, host: str, port: int, *, keepalive_s: float = KEEPALIVE_S,
                 max_idle: int = MAX_IDLE, quiet_s: float = QUIET_S, reuse: bool = True,
                 on_desync: Callable[[str], None] | None = None) -> None:
        self.host = host
        self.port = port
        self.keepalive_s = keepalive_s
        self.max_idle = max_idle
        self.quiet_s = quiet_s
        self.reuse = reuse
        self.desynced: str | None = None  # why the origin stopped reusing connections
        self.on_desync = on_desync
        self._cooling: deque[_Connection] = deque()  # oldest first
        self._ready: deque[_Connection] = deque()  # most recent last
        self._busy: set[_Connection] = set()

    async def post(self, target: bytes, host_header: bytes, headers: dict[str, str],
                   body: bytes, *, timeout_s: float, connect_timeout_s: float) -> Response:
        """Send POST `target` with `headers` and `body`; the answer once its head is read."""
        words = "".join(headers) + "".join(headers.values())
        if "\n" in words or "\r" in words:
            raise ValueError("a header name or value contains a line break")
        lines = "".join([f"{k}: {v}\r\n" for k, v in headers.items()])
        data = b"".join((b"POST ", target, b" HTTP/1.1\r\nhost: ", host_header,
                         b"\r\ncontent-length: %d\r\n" % len(body),
                         b"" if self.reuse else b"connection: close\r\n",
                         lines.encode("latin-1"), b"\r\n", body))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        for attempt in (0, 1):
            conn = self._take(time.monotonic()) if attempt == 0 else None
            reused = conn is not None
            if conn is None:
                conn = await self._connect(loop, min(connect_timeout_s,
                                                     max(0.0, deadline - loop.time())))
            self._busy.add(conn)
            resp = Response()
            resp._timer = loop.call_at(deadline, conn.timed_out)
            try:
                await conn.send(data, resp)
            except UpstreamDisconnected:
                resp.release()
                if reused and not conn.got_bytes and attempt == 0:
                    # A kept connection the server had closed as it was reused: the request
                    # is sent once more, on a new one. No byte of an answer came, so the
                    # server did not answer it (it may have read it: a model call is not
                    # idempotent, and this is the one resend; docs/security.md).
                    continue
                raise
            except BaseException:
                resp.release()  # cancelled, timed out or broken mid-request: never reused
                raise
            return resp
        raise AssertionError("unreachable")

    async def _connect(self, loop: asyncio.AbstractEventLoop, timeout: float) -> _Connection:
        async with asyncio.timeout(timeout):
            _, conn = await loop.create_connection(lambda: _Connection(self), self.host,
                                                   self.port)
        return conn

    def _take(self, now: float) -> _Connection | None:
        """The most recently used connection that has been quiet for `quiet_s`, its socket
        polled empty; None when there is none (a new one is opened)."""
        cooling, ready = self._cooling, self._ready
        quiet_since = now - self.quiet_s
        while cooling and cooling[0].idle_since <= quiet_since:
            ready.append(cooling.popleft())
        while ready:
            conn = ready.pop()
            if conn.closed or now - conn.idle_since >= self.keepalive_s:
                conn.abort()
                continue
            if conn.unread():  # (bytes the loop has not read yet: never reused)
                conn.abort()
                continue
            return conn
        return None

    def idle(self, conn: _Connection) -> None:
        self._busy.discard(conn)
        if len(self._cooling) + len(self._ready) >= self.max_idle:
            conn.abort()
            return
        conn.idle_since = time.monotonic()
        self._cooling.append(conn)

    def forget(self, conn: _Connection) -> None:
        self._busy.discard(conn)
        for pool in (self._ready, self._cooling):
            if conn in pool:
                pool.remove(conn)
                return

    def desync(self, conn: _Connection, why: str) -> None:
        """`conn` received what no request asked for: it is closed, and the origin reuses
        no connection from here on (every kept one is closed as well)."""
        conn.abort()
        if not self.reuse:
            return
        self.reuse = False
        self.desynced = why
        for kept in [*self._cooling, *self._ready]:
            kept.abort()
        if self.on_desync is not None:
            self.on_desync(why)

    def close(self) -> None:
        for conn in [*self._cooling, *self._ready, *self._busy]:
            conn.abort()
        self._cooling.clear()
        self._ready.clear()
        self._busy.clear()
