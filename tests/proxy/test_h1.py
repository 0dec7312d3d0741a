"""The HTTP/1.1 upstream client (proxy/h1.py) against real sockets: scripted servers for each
framing and failure, on asyncio's loop and on uvloop's (the one `budgetproxy serve` runs)."""

from __future__ import annotations

import asyncio
import gc
import gzip
import weakref
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import pytest
import uvloop

from budgetproxy.proxy import h1

LOOPS = {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@pytest.fixture(params=sorted(LOOPS))
def run(request: pytest.FixtureRequest) -> Callable[[Coroutine[Any, Any, Any]], Any]:
    def runner(coro: Coroutine[Any, Any, Any]) -> Any:
        with asyncio.Runner(loop_factory=LOOPS[request.param]) as r:
            return r.run(asyncio.wait_for(coro, 20))
    return runner


class Server:
    """A TCP server that answers each request on a connection with `handler`'s script."""

    def __init__(self, handler: Callable[[Server, asyncio.StreamReader, asyncio.StreamWriter],
                                         Awaitable[None]]) -> None:
        self.handler = handler
        self.connections = 0
        self.requests: list[bytes] = []
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> Server:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.sockets[0].getsockname()[1])

    def origin(self, **kw: Any) -> h1.Origin:
        """A client origin for this server; a kept connection is reused at once unless
        `quiet_s` says otherwise (the quiet rule has tests of its own)."""
        return h1.Origin("127.0.0.1", self.port, **{"quiet_s": 0.0, **kw})

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.handler(self, reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def read_request(self, reader: asyncio.StreamReader) -> bytes:
        head = await reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":", 1)[1])
        request = head + await reader.readexactly(length)
        self.requests.append(request)
        return request


def ok(body: bytes, *extra: bytes) -> bytes:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
    return head % len(body) + b"".join(h + b"\r\n" for h in extra) + b"\r\n" + body


async def post(origin: h1.Origin, body: bytes = b'{"a":1}', timeout_s: float = 5.0,
               **headers: str) -> h1.Response:
    return await origin.post(b"/v1/chat/completions?x=1", b"127.0.0.1:1234",
                             {"content-type": "application/json", **headers}, body,
                             timeout_s=timeout_s, connect_timeout_s=2.0)


async def keep_answering(srv: Server, reader: asyncio.StreamReader,
                         writer: asyncio.StreamWriter) -> None:
    while True:
        request = await srv.read_request(reader)
        writer.write(ok(b'{"n":%d,"len":%d}' % (len(srv.requests), len(request))))
        await writer.drain()


def test_the_request_on_the_wire_and_a_connection_kept_alive(run: Any) -> None:
    async def go() -> None:
        async with Server(keep_answering) as srv:
            origin = srv.origin()
            for n in (1, 2, 3):
                resp = await post(origin, b'{"turn":%d}' % n, authorization="Bearer k")
                assert resp.status == 200 and resp.header("content-type") == "application/json"
                assert (await resp.read()).startswith(b'{"n":%d,' % n)
                resp.release()
            assert srv.connections == 1  # one keep-alive connection carried all three
            assert srv.requests[0] == (
                b"POST /v1/chat/completions?x=1 HTTP/1.1\r\nhost: 127.0.0.1:1234\r\n"
                b"content-length: 10\r\ncontent-type: application/json\r\n"
                b"authorization: Bearer k\r\n\r\n{\"turn\":1}")
            origin.close()
    run(go())


def test_concurrent_calls_each_get_their_own_answer(run: Any) -> None:
    async def echo(srv: Server, reader: asyncio.StreamReader,
                   writer: asyncio.StreamWriter) -> None:
        while True:
            request = await srv.read_request(reader)
            await asyncio.sleep(0.05)
            writer.write(ok(request.split(b"\r\n\r\n", 1)[1]))

    async def go() -> None:
        async with Server(echo) as srv:
            origin = srv.origin()

            async def one(i: int) -> bytes:
                resp = await post(origin, b'{"i":%d}' % i)
                try:
                    return await resp.read()
                finally:
                    resp.release()
            bodies = await asyncio.gather(*[one(i) for i in range(20)])
            assert bodies == [b'{"i":%d}' % i for i in range(20)]
            assert srv.connections == 20
            await asyncio.gather(*[one(i) for i in range(20)])
            assert srv.connections == 20  # the second round reused them all
            origin.close()
    run(go())


def test_a_chunked_stream_arrives_part_by_part(run: Any) -> None:
    sent_second = asyncio.Event()

    async def stream(srv: Server, reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> None:
        await srv.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                     b"transfer-encoding: chunked\r\n\r\n")
        writer.write(b"10\r\ndata: {\"a\": 1}\n\n\r\n")
        await writer.drain()
        await asyncio.sleep(0.2)
        sent_second.set()
        writer.write(b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n")
        await writer.drain()
        await reader.read()

    async def go() -> None:
        async with Server(stream) as srv:
            origin = srv.origin()
            resp = await post(origin)
            parts = []
            async for part in resp.iter_any():
                parts.append((part, sent_second.is_set()))
            resp.release()
            assert parts == [(b'data: {"a": 1}\n\n', False), (b"data: [DONE]\n\n", True)]
            origin.close()
    run(go())


def test_a_body_ended_by_the_connection_close(run: Any) -> None:
    async def close_delimited(srv: Server, reader: asyncio.StreamReader,
                              writer: asyncio.StreamWriter) -> None:
        await srv.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n" + b"x" * 100_000)
        await writer.drain()

    async def go() -> None:
        async with Server(close_delimited) as srv:
            origin = srv.origin()
            resp = await post(origin)
            assert await resp.read() == b"x" * 100_000
            resp.release()
            resp = await post(origin)  # not reused: a new connection
            assert len(await resp.read()) == 100_000
            assert srv.connections == 2
            origin.close()
    run(go())


def test_a_kept_connection_the_server_dropped_is_retried_once_on_a_new_one(run: Any) -> None:
    async def one_per_connection(srv: Server, reader: asyncio.StreamReader,
                                 writer: asyncio.StreamWriter) -> None:
        await srv.read_request(reader)
        writer.write(ok(b"{}"))  # says keep-alive, then drops it once the next request comes
        await writer.drain()
        await reader.read(1)

    async def go() -> None:
        async with Server(one_per_connection) as srv:
            origin = srv.origin()
            for _ in range(3):
                resp = await post(origin)
                assert await resp.read() == b"{}"
                resp.release()
            assert srv.connections == 3
            assert len(srv.requests) == 3  # a dropped request never reached a handler twice
            origin.close()
    run(go())


def test_a_break_mid_body_and_no_answer_at_all_are_errors(run: Any) -> None:
    async def half(srv: Server, reader: asyncio.StreamReader,
                   writer: asyncio.StreamWriter) -> None:
        request = await srv.read_request(reader)
        if b"mid" in request:
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n" + b"x" * 10)
            await writer.drain()
        # then close (or close at once): no whole answer

    async def go() -> None:
        async with Server(half) as srv:
            origin = srv.origin()
            resp = await post(origin, b"mid")
            with pytest.raises(h1.UpstreamDisconnected):
                await resp.read()
            resp.release()
            with pytest.raises(h1.UpstreamDisconnected):  # a new connection: no retry
                await post(origin, b"none")
            assert len(srv.requests) == 2
            origin.close()
    run(go())


def test_the_timeout_bounds_the_whole_exchange(run: Any) -> None:
    async def stall(srv: Server, reader: asyncio.StreamReader,
                    writer: asyncio.StreamWriter) -> None:
        request = await srv.read_request(reader)
        if b"body" in request:  # the head, then nothing
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n1\r\nx\r\n")
            await writer.drain()
        await reader.read()

    async def go() -> None:
        async with Server(stall) as srv:
            origin = srv.origin()
            loop = asyncio.get_running_loop()
            t = loop.time()
            with pytest.raises(TimeoutError):
                await post(origin, b"head", timeout_s=0.3)
            assert 0.25 < loop.time() - t < 2
            resp = await post(origin, b"body", timeout_s=0.3)
            parts = []
            with pytest.raises(TimeoutError):
                async for part in resp.iter_any():
                    parts.append(part)
            resp.release()
            assert parts == [b"x"]
            assert srv.connections == 2  # a timed-out connection is not reused
            origin.close()
    run(go())


def test_a_refused_connection_is_an_os_error(run: Any) -> None:
    async def go() -> None:
        async with Server(keep_answering) as srv:
            port = srv.port
        origin = h1.Origin("127.0.0.1", port)
        with pytest.raises(OSError):
            await post(origin)
    run(go())


def test_content_codings_and_interim_answers(run: Any) -> None:
    async def coded(srv: Server, reader: asyncio.StreamReader,
                    writer: asyncio.StreamWriter) -> None:
        while True:
            request = await srv.read_request(reader)
            if b"gzip" in request:
                writer.write(ok(gzip.compress(b'{"zipped":true}'), b"content-encoding: gzip"))
            elif b"br" in request:
                writer.write(ok(b"\x00\x01", b"content-encoding: br"))
            else:
                writer.write(b"HTTP/1.1 100 Continue\r\n\r\n" + ok(b'{"after":100}'))

    async def go() -> None:
        async with Server(coded) as srv:
            origin = srv.origin()
            resp = await post(origin, b"gzip")
            assert await resp.read() == b'{"zipped":true}'
            resp.release()
            resp = await post(origin, b"interim")
            assert resp.status == 200 and await resp.read() == b'{"after":100}'
            resp.release()
            with pytest.raises(h1.UpstreamProtocolError, match="content-encoding 'br'"):
                await post(origin, b"br")
            origin.close()
    run(go())


def test_bytes_that_are_not_http_are_a_protocol_error(run: Any) -> None:
    async def garbage(srv: Server, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
        await srv.read_request(reader)
        writer.write(b"SSH-2.0-OpenSSH_9.2\r\n\r\n")
        await writer.drain()
        await reader.read()

    async def go() -> None:
        async with Server(garbage) as srv:
            origin = srv.origin()
            with pytest.raises(h1.UpstreamProtocolError):
                await post(origin)
            origin.close()
    run(go())


def test_a_line_break_in_a_header_is_refused_before_anything_is_sent(run: Any) -> None:
    async def go() -> None:
        async with Server(keep_answering) as srv:
            origin = srv.origin()
            with pytest.raises(ValueError, match="line break"):
                await post(origin, **{"x-key": "k\r\nx-evil: 1"})
            await asyncio.sleep(0.05)
            assert srv.requests == []
            origin.close()
    run(go())


def test_a_slow_reader_pauses_the_stream_and_loses_nothing(run: Any) -> None:
    size = 4 * h1.HIGH_WATER

    async def big(srv: Server, reader: asyncio.StreamReader,
                  writer: asyncio.StreamWriter) -> None:
        await srv.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % size)
        for i in range(size // 1024):
            writer.write(bytes([i % 251]) * 1024)
        await writer.drain()
        await reader.read()

    async def go() -> None:
        async with Server(big) as srv:
            origin = srv.origin()
            resp = await post(origin)
            got = bytearray()
            paused = False
            async for part in resp.iter_any():
                got += part
                await asyncio.sleep(0.01)
                conn = resp._conn
                paused = paused or (conn is not None and conn.paused)
            assert paused
            assert bytes(got) == b"".join(bytes([i % 251]) * 1024 for i in range(size // 1024))
            resp.release()
            origin.close()
    run(go())


def test_an_answer_given_up_closes_its_connection(run: Any) -> None:
    async def slow_stream(srv: Server, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
        while True:
            await srv.read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n1\r\nx\r\n")
            await writer.drain()
            await asyncio.sleep(0.2)
            writer.write(b"0\r\n\r\n")

    async def go() -> None:
        async with Server(slow_stream) as srv:
            origin = srv.origin()
            resp = await post(origin)
            async for _ in resp.iter_any():
                break
            resp.release()  # the client went away mid-stream
            resp = await post(origin)
            assert await resp.read() == b"x"
            resp.release()
            assert srv.connections == 2

            task = asyncio.ensure_future(post(origin))  # cancelled while waiting for the head
            await asyncio.sleep(0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            resp = await post(origin)
            assert await resp.read() == b"x"
            resp.release()
            origin.close()
    run(go())


def test_a_closed_connection_is_freed_without_the_collector(
        run: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A connection closed by the server, given up by the client or closed with its origin
    leaves no cycle behind (its parser and transport let go of it): the server runs with the
    collector's full passes rare (serve/server.py tune_gc), and each cycle kept a closed
    connection's buffers until one came."""
    made: list[weakref.ref[h1._Connection]] = []
    real_init = h1._Connection.__init__

    def init(self: h1._Connection, origin: h1.Origin) -> None:
        real_init(self, origin)
        made.append(weakref.ref(self))

    monkeypatch.setattr(h1._Connection, "__init__", init)

    async def close_or_stall(srv: Server, reader: asyncio.StreamReader,
                             writer: asyncio.StreamWriter) -> None:
        request = await srv.read_request(reader)
        if b"close" in request:
            writer.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n" + b"x" * 10_000)
            return
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n1\r\nx\r\n")
        await writer.drain()
        await asyncio.sleep(5)

    async def go() -> None:
        async with Server(close_or_stall) as srv:
            origin = srv.origin()
            resp = await post(origin, b"close")  # the server closes it after its answer
            assert len(await resp.read()) == 10_000
            resp.release()
            resp = await post(origin, b"stall")  # the client gives it up mid-stream
            async for _ in resp.iter_any():
                break
            resp.release()
            del resp
            for _ in range(5):
                await asyncio.sleep(0.01)  # the transports report their close
            origin.close()

    gc.disable()
    try:
        run(go())
        assert len(made) == 2
        assert [ref() for ref in made] == [None, None]
    finally:
        gc.enable()
