"""No answer reaches a request it does not answer (proxy/h1.py): hostile upstreams on real
sockets, the same scripts through aiohttp beside the built-in client, and random sequences of
well-formed and hostile answers whose bodies echo each request's nonce."""

from __future__ import annotations

import asyncio
import gzip
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from budgetproxy.proxy import h1

NONCE = re.compile(rb'"nonce":"([0-9a-z-]+)"')


def answer(body: bytes, status: bytes = b"200 OK", *extra: bytes) -> bytes:
    head = b"HTTP/1.1 %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
    return head % (status, len(body)) + b"".join(h + b"\r\n" for h in extra) + b"\r\n" + body


def echo(request_body: bytes) -> bytes:
    """The answer to a request: its nonce back."""
    m = NONCE.search(request_body)
    return b'{"nonce":"%s"}' % (m.group(1) if m else b"none")


# What the upstream does after reading a request: (what it writes at once, what it writes
# `delay` seconds later on the same connection, whether it then closes).
@dataclass
class Move:
    kind: str
    delay: float = 0.0


Script = Callable[[bytes, bytes], tuple[bytes, bytes]]  # (request body, last answer) -> writes

def chunked(body: bytes) -> bytes:
    half = len(body) // 2
    return (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
            b"transfer-encoding: chunked\r\n\r\n"
            + b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in (body[:half], body[half:]))
            + b"0\r\n\r\n")


def gzipped(body: bytes) -> bytes:
    packed = gzip.compress(body)
    return (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-encoding: gzip\r\n"
            b"content-length: %d\r\n\r\n" % len(packed) + packed)


MOVES: dict[str, Script] = {
    "ok": lambda body, last: (answer(echo(body)), b""),
    "chunked": lambda body, last: (chunked(echo(body)), b""),
    "gzip": lambda body, last: (gzipped(echo(body)), b""),
    "interim": lambda body, last: (b"HTTP/1.1 100 Continue\r\n\r\n" + answer(echo(body)), b""),
    "error_status": lambda body, last: (answer(echo(body), b"503 Service Unavailable"), b""),
    # the answer, then the previous exchange's answer again: a stray second response
    "stray": lambda body, last: (answer(echo(body)), answer(echo(body))),
    # the answer, then bytes that are no answer at all
    "tail": lambda body, last: (answer(echo(body)), b"garbage after the answer\r\n"),
    # the answer with a second one in the same write
    "two_at_once": lambda body, last: (answer(echo(body)) + answer(echo(body)), b""),
    "status_999": lambda body, last: (answer(echo(body), b"999 Odd"), b""),
    "switch": lambda body, last: (
        b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: upgrade\r\n\r\n"
        + echo(body), b""),
    "not_http": lambda body, last: (b"SSH-2.0-OpenSSH\r\n", b""),
}


@dataclass
class Upstream:
    """A raw-socket upstream: each request gets the next move of `moves` (then "ok")."""

    moves: list[Move]
    pace: float = 0.0  # seconds before each answer
    connections: int = 0
    requests: int = 0
    server: asyncio.Server | None = None
    tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def __aenter__(self) -> Upstream:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        for t in self.tasks:
            t.cancel()

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.sockets[0].getsockname()[1])

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        last = b""
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))  # type: ignore[union-attr]
                body = await reader.readexactly(length)
                move = self.moves[self.requests] if self.requests < len(self.moves) else Move("ok")
                self.requests += 1
                if self.pace:
                    await asyncio.sleep(self.pace)
                now, later = MOVES[move.kind](body, last)
                writer.write(now)
                last = now
                if later:
                    self._later(writer, later, move.delay)
                if b"connection: close" in head.lower():
                    await writer.drain()
                    writer.close()
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            pass

    def _later(self, writer: asyncio.StreamWriter, data: bytes, delay: float) -> None:
        async def write() -> None:
            await asyncio.sleep(delay)
            if not writer.is_closing():
                writer.write(data)

        task = asyncio.ensure_future(write())
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)


async def h1_call(origin: h1.Origin, nonce: str) -> tuple[int, bytes] | str:
    """(status, body), or the failure's class name."""
    try:
        resp = await origin.post(b"/v1/chat/completions", b"127.0.0.1", {},
                                 b'{"nonce":"%s"}' % nonce.encode(), timeout_s=2.0,
                                 connect_timeout_s=1.0)
    except (ConnectionError, OSError, TimeoutError) as e:
        return type(e).__name__
    try:
        return resp.status, await resp.read()
    except (ConnectionError, OSError, TimeoutError) as e:
        return type(e).__name__
    finally:
        resp.release()


def own_or_failed(nonce: str, got: tuple[int, bytes] | str) -> bool:
    """The call got its own answer, or failed: never another request's."""
    if isinstance(got, str):
        return True
    m = NONCE.search(got[1])
    return m is not None and m.group(1).decode() == nonce


def other_nonce(nonce: str, got: tuple[int, bytes] | str) -> bool:
    """The call got an answer that carries another request's nonce."""
    if isinstance(got, str):
        return False
    m = NONCE.search(got[1])
    return m is not None and m.group(1).decode() != nonce


# -- the hostile cases, one by one ------------------------------------------------------------

async def sequential(moves: list[Move], n: int, gap: float = 0.0, pace: float = 0.0,
                     **origin_kw: Any) -> tuple[list[tuple[str, tuple[int, bytes] | str]],
                                                h1.Origin, Upstream]:
    async with Upstream(moves, pace) as up:
        origin = h1.Origin("127.0.0.1", up.port, **origin_kw)
        got = []
        for i in range(n):
            nonce = f"n{i}"
            got.append((nonce, await h1_call(origin, nonce)))
            await asyncio.sleep(gap)
        origin.close()
        return got, origin, up


async def test_a_late_second_answer_reaches_no_later_call() -> None:
    """Each answer followed 150 ms later by a second copy of it, calls one after another:
    every call gets its own answer, and the first stray stops reuse."""
    got, origin, up = await sequential([Move("stray", 0.15)] * 12, 12, gap=0.03,
                                       quiet_s=0.25)
    assert all(own_or_failed(n, g) for n, g in got), got
    assert all(not isinstance(g, str) for _, g in got)  # and none failed
    assert origin.desynced is not None and origin.reuse is False


async def test_late_tail_bytes_close_the_connection_and_stop_reuse() -> None:
    got, origin, _ = await sequential([Move("tail", 0.05)], 6, gap=0.1, quiet_s=0.25)
    assert all(own_or_failed(n, g) and not isinstance(g, str) for n, g in got), got
    assert origin.desynced is not None


async def test_two_answers_in_one_write_are_both_refused_reuse() -> None:
    got, origin, up = await sequential([Move("two_at_once")], 5, quiet_s=0.0)
    assert all(own_or_failed(n, g) and not isinstance(g, str) for n, g in got), got
    assert origin.desynced is not None
    assert up.connections >= 2  # the desynchronised connection was not reused


async def test_a_status_outside_http_and_a_protocol_switch_fail_cleanly() -> None:
    errors: list[dict[str, Any]] = []
    asyncio.get_running_loop().set_exception_handler(lambda _, ctx: errors.append(ctx))
    for kind in ("status_999", "switch", "not_http"):
        got, _, _ = await sequential([Move(kind)], 2, quiet_s=0.0)
        assert got[0][1] == "UpstreamProtocolError", (kind, got)
        assert got[1][1] == (200, b'{"nonce":"n1"}'), (kind, got)  # the next call is fine
    await asyncio.sleep(0.05)
    assert errors == []  # nothing escaped to the loop ("Fatal error on transport")


async def test_bytes_not_yet_read_keep_a_connection_from_reuse() -> None:
    """The poll before reuse: bytes in the socket that the loop has not read."""
    async with Upstream([Move("tail", 0.02)]) as up:
        origin = h1.Origin("127.0.0.1", up.port, quiet_s=0.0)
        assert await h1_call(origin, "a") == (200, b'{"nonce":"a"}')
        (conn,) = origin._cooling
        assert conn.transport is not None
        conn.transport.pause_reading()  # the stray stays in the kernel's buffer
        await asyncio.sleep(0.1)
        assert conn.unread()
        assert await h1_call(origin, "b") == (200, b'{"nonce":"b"}')
        assert up.connections == 2 and conn.closed
        origin.close()


async def test_without_reuse_every_call_has_its_own_connection() -> None:
    """reuse=False: `connection: close` on every request; strays at any delay cross nothing."""
    moves = [Move("stray", d) for d in (0.0, 0.01, 0.3, 0.02, 0.5, 0.0)]
    got, origin, up = await sequential(moves, 6, quiet_s=0.0, reuse=False)
    assert all(own_or_failed(n, g) and not isinstance(g, str) for n, g in got), got
    assert up.connections == 6


async def test_a_quiet_period_keeps_reuse_for_a_well_behaved_upstream() -> None:
    got, origin, up = await sequential([], 4, gap=0.06, quiet_s=0.05)
    assert [g for _, g in got] == [(200, b'{"nonce":"n%d"}' % i) for i in range(4)]
    assert up.connections == 1 and origin.desynced is None
    got, origin, up = await sequential([], 4, gap=0.0, quiet_s=0.05)
    assert up.connections == 4  # back-to-back calls: none quiet long enough, a new one each


# -- the same scripts through aiohttp ---------------------------------------------------------

async def aiohttp_call(session: aiohttp.ClientSession, port: int,
                       nonce: str) -> tuple[int, bytes] | str:
    try:
        async with session.post(f"http://127.0.0.1:{port}/v1/chat/completions",
                                data=b'{"nonce":"%s"}' % nonce.encode(),
                                timeout=aiohttp.ClientTimeout(total=2)) as resp:
            return resp.status, await resp.read()
    except (aiohttp.ClientError, OSError, TimeoutError) as e:
        return type(e).__name__


WELL_FORMED = ["ok", "chunked", "gzip", "interim", "error_status"]
HOSTILE = ["stray", "tail", "two_at_once", "status_999", "switch", "not_http"]


@pytest.mark.parametrize("kind", WELL_FORMED + HOSTILE)
async def test_differential_against_aiohttp(kind: str) -> None:
    """The built-in client and aiohttp over one script: on well-formed answers they return
    the same; on hostile ones the built-in client never returns another call's answer, and
    where aiohttp does, the test says so (`crossed`)."""
    moves = [Move(kind, 0.05)] * 4  # answers after 100 ms, strays 50 ms after an answer
    got_h1, _, _ = await sequential(moves, 4, pace=0.1, quiet_s=0.25)
    async with Upstream(moves, pace=0.1) as up:
        async with aiohttp.ClientSession() as session:
            got_aio = [(f"n{i}", await aiohttp_call(session, up.port, f"n{i}"))
                       for i in range(4)]
    assert all(own_or_failed(n, g) for n, g in got_h1), got_h1
    if kind in WELL_FORMED:
        assert [g for _, g in got_h1] == [g for _, g in got_aio]
    crossed = [n for n, g in got_aio if other_nonce(n, g)]
    # aiohttp reuses a kept connection at once: a stray written after the next request went
    # out is read as that request's answer, and every later one shifts by one.
    assert crossed == ([] if kind != "stray" else ["n1", "n2", "n3"]), got_aio


# -- random sequences -------------------------------------------------------------------------

move_st = st.one_of(
    st.builds(Move, st.sampled_from(WELL_FORMED)),
    st.builds(Move, st.sampled_from(["stray", "tail"]),
              st.floats(min_value=0.0, max_value=0.04)),
    st.builds(Move, st.sampled_from(["two_at_once", "status_999", "switch", "not_http"])),
)


@settings(max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(moves=st.lists(move_st, min_size=1, max_size=8),
       gaps=st.lists(st.sampled_from([0.0, 0.0, 0.01, 0.06]), min_size=8, max_size=8),
       concurrency=st.sampled_from([1, 3]))
def test_no_sequence_of_answers_shifts_one_onto_another_request(
        moves: list[Move], gaps: list[float], concurrency: int) -> None:
    """Strays come within the quiet period (50 ms here); calls go one by one or three at a
    time; every answer a call gets carries its own nonce."""
    async def go() -> list[tuple[str, tuple[int, bytes] | str]]:
        async with Upstream(moves) as up:
            origin = h1.Origin("127.0.0.1", up.port, quiet_s=0.05)
            got: list[tuple[str, tuple[int, bytes] | str]] = []

            async def worker(w: int) -> None:
                for i, gap in enumerate(gaps):
                    nonce = f"w{w}-{i}"
                    got.append((nonce, await h1_call(origin, nonce)))
                    await asyncio.sleep(gap)
            await asyncio.gather(*[worker(w) for w in range(concurrency)])
            await asyncio.sleep(0.06)  # late strays land before the upstream closes
            origin.close()
            return got

    got = asyncio.run(asyncio.wait_for(go(), 30))
    assert all(own_or_failed(n, g) for n, g in got), [x for x in got if not own_or_failed(*x)]
    assert sum(not isinstance(g, str) for _, g in got) >= len(got) - len(moves)
