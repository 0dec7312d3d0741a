"""The Redis store's hot path: scripts pipelined on one connection.

Every script a request issues (its turn's reserve, its settle, its turn log's append) is packed
into a write buffer that goes out once per event-loop iteration; replies come back in order and
are matched to their futures as they arrive, in the transport's own callback, with hiredis. No
task, timer or lock per command or batch, and several batches may be in flight at once: what
redis-py's connection and pipeline cost per call was more than the rest of the store.

The connection is opened (address, TLS, AUTH, SELECT: whatever the URL says) by redis-py and
then taken over. Commands are never retried: a script whose reply was lost may have run. A
dropped connection fails the calls in flight (the caller sees StoreUnavailable) and the next
call opens a new one; replies that take longer than the socket timeout fail everything in
flight and drop the connection.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any

import hiredis
from redis import exceptions as rexc
from redis._parsers import _AsyncHiredisParser
from redis.exceptions import InvalidResponse

# (script op, future, what turns the reply into the future's result)
Pending = tuple[Any, "asyncio.Future[Any]", "Callable[[Any], Any] | None"]


def resolve(fut: asyncio.Future[Any], convert: Callable[[Any], Any] | None, reply: Any) -> None:
    """The future gets the reply (an error reply as its result, not raised), or with `convert`
    what it makes of it, or the exception it raised."""
    if fut.done():
        return
    if convert is None:
        fut.set_result(reply)
        return
    try:
        fut.set_result(convert(reply))
    except Exception as e:
        fut.set_exception(e)


class _Link(asyncio.Protocol):
    """One connection taken over from redis-py: what went out on it, in order, and the
    reader its replies are parsed with."""

    def __init__(self, pipe: ScriptPipe, conn: Any, transport: Any) -> None:
        self.pipe = pipe
        self.conn = conn  # redis-py's connection, kept while its transport is ours
        self.transport = transport
        self.reader = hiredis.Reader(protocolError=InvalidResponse, replyError=pipe.errors)
        self.pending: deque[Pending] = deque()
        self.progress = 0.0  # when a reply last came (or the first call in flight went out)
        self.watchdog: asyncio.TimerHandle | None = None

    def write(self, calls: list[Pending], data: bytes, now: float) -> None:
        if not self.pending:
            self.progress = now
        self.pending.extend(calls)
        self.transport.write(data)
        if self.watchdog is None:
            self.watchdog = self.pipe.loop.call_at(self.progress + self.pipe.timeout, self.check)

    def data_received(self, data: bytes) -> None:
        reader = self.reader
        reader.feed(data)
        pending = self.pending
        while True:
            reply = reader.gets(False)
            if reply is False:
                break
            if not pending:  # a reply nobody asked for: the stream is not ours to read
                self.drop(rexc.ConnectionError("unexpected reply from Redis"))
                return
            op, fut, convert = pending.popleft()
            if type(reply) is rexc.NoScriptError:  # a restarted or flushed Redis
                self.pipe.reload(op, fut, convert)
            else:
                resolve(fut, convert, reply)
        self.progress = self.pipe.loop.time()

    def eof_received(self) -> bool:
        return False  # the transport closes; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.drop(exc if isinstance(exc, Exception) else rexc.ConnectionError(
            "Redis closed the connection"))

    def check(self) -> None:
        self.watchdog = None
        if not self.pending:
            return
        loop = self.pipe.loop
        if loop.time() - self.progress >= self.pipe.timeout:
            self.drop(rexc.TimeoutError("Timeout reading from Redis"))
        else:
            self.watchdog = loop.call_at(self.progress + self.pipe.timeout, self.check)

    def drop(self, error: Exception) -> None:
        """Fail what is in flight and close the connection (replies may still be on the way:
        it is not read again)."""
        if self.pipe.link is self:
            self.pipe.link = None
        if self.watchdog is not None:
            self.watchdog.cancel()
            self.watchdog = None
        pending, self.pending = self.pending, deque()
        for _, fut, convert in pending:
            resolve(fut, convert, error)
        if not self.transport.is_closing():
            self.transport.abort()


class ScriptPipe:
    """Scripts on one pipelined connection, opened on first use and again after a loss."""

    def __init__(self, redis: Any, pack: Callable[[Any], bytes], timeout_s: float) -> None:
        self._redis = redis  # the redis-py client: its pool's settings open the connection
        self._pack = pack
        self.timeout = timeout_s
        self.loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]  # first submit
        self.link: _Link | None = None
        self._connecting: asyncio.Task[None] | None = None
        self._calls: list[Pending] = []  # packed into _out, not yet written
        self._out: list[bytes] = []
        self._scheduled = False
        # redis-py's mapping of error replies to its exceptions (NOSCRIPT, READONLY, LOADING...)
        self.errors = _AsyncHiredisParser(socket_read_size=65536).parse_error
        self.reloads: set[asyncio.Task[None]] = set()

    def submit(self, op: Any, fut: asyncio.Future[Any],
               convert: Callable[[Any], Any] | None) -> None:
        self._calls.append((op, fut, convert))
        self._out.append(self._pack(op))
        if not self._scheduled:
            self._scheduled = True
            if self.loop is None:
                self.loop = asyncio.get_running_loop()
            self.loop.call_soon(self._write)

    def _write(self) -> None:
        self._scheduled = False
        if not self._calls:
            return
        link = self.link
        if link is None:
            if self._connecting is None:
                self._connecting = asyncio.ensure_future(self._connect())
            return  # written once connected
        calls, self._calls = self._calls, []
        data = b"".join(self._out)
        self._out.clear()
        link.write(calls, data, self.loop.time())

    async def _connect(self) -> None:
        pool = self._redis.connection_pool
        conn = pool.connection_class(**{**pool.connection_kwargs, "socket_timeout": None})
        try:
            try:
                async with asyncio.timeout(self.timeout):
                    await conn.connect()  # the handshake: AUTH, SELECT, ... as the URL says
                if conn._reader is not None and conn._reader._buffer:
                    raise rexc.ConnectionError("unexpected data after the Redis handshake")
            except Exception as e:
                await conn.disconnect()
                self._fail(e)
                return
            except BaseException:
                await conn.disconnect()
                self._fail(rexc.ConnectionError("the connection to Redis was cancelled"))
                raise
        finally:
            self._connecting = None
        transport = conn._writer.transport
        link = _Link(self, conn, transport)
        transport.set_protocol(link)
        self.link = link
        self._write()

    def _fail(self, error: Exception) -> None:
        calls, self._calls = self._calls, []
        self._out.clear()
        for _, fut, convert in calls:
            resolve(fut, convert, error)

    def reload(self, op: Any, fut: asyncio.Future[Any],
               convert: Callable[[Any], Any] | None) -> None:
        """The script did not run: load it and run it (redis-py's Script does both)."""
        async def again() -> None:
            try:
                reply = await op.script(keys=op.keys, args=op.args)
            except Exception as e:
                reply = e
            resolve(fut, convert, reply)

        task = asyncio.ensure_future(again())
        self.reloads.add(task)
        task.add_done_callback(self.reloads.discard)

    async def drain(self) -> None:
        """Wait for every reply in flight, and the calls their callbacks make."""
        while True:
            futs = [fut for _, fut, _ in self._calls]
            if self.link is not None:
                futs += [fut for _, fut, _ in self.link.pending]
            if not futs and not self.reloads and self._connecting is None:
                return
            if self._connecting is not None:
                futs.append(self._connecting)
            await asyncio.gather(*futs, *self.reloads, return_exceptions=True)
            await asyncio.sleep(0)

    def close(self) -> None:
        self._fail(rexc.ConnectionError("the Redis store was closed"))
        if self.link is not None:
            self.link.drop(rexc.ConnectionError("the Redis store was closed"))
