"""Connection limits, tried with raw sockets against the real server: oversized and
too many headers (431), slow headers and bodies (408), connection caps (503); each answer
OpenAI-shaped, each connection closed, and the proxy still serving afterwards."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from conftest import Proxy, ProxyFactory, new_id

LIMITS = {"max_header_bytes": 4096, "max_headers": 20, "header_timeout_s": 0.6,
          "body_timeout_s": 0.6}


@pytest.fixture(scope="module")
def bounded(proxy: ProxyFactory) -> Proxy:
    return proxy({"server": LIMITS})


@contextmanager
def connection(proxy: Proxy) -> Iterator[socket.socket]:
    host, port = proxy.url.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)), timeout=10)
    try:
        yield s
    finally:
        s.close()


def read_all(s: socket.socket) -> bytes:
    """Everything until the server closes the connection (a reset ends it too)."""
    data = b""
    try:
        while chunk := s.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    return data


def error_of(answer: bytes, status: int) -> dict[str, object]:
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 %d " % status), answer[:300]
    assert b"connection: close" in head.lower()
    err: dict[str, object] = json.loads(body)["error"]
    return err


def still_serving(proxy: Proxy) -> None:
    r = proxy.http().post("/v1/chat/completions", headers={"X-Episode-Id": new_id("ok")},
                          json={"model": "m1", "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 200, r.text


def test_a_head_past_max_header_bytes_is_a_431(bounded: Proxy) -> None:
    with connection(bounded) as s:
        s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 8000 + b"\r\n\r\n")
        err = error_of(read_all(s), 431)
    assert err["code"] == "request_header_fields_too_large"
    still_serving(bounded)


def test_too_many_header_fields_is_a_431(bounded: Proxy) -> None:
    fields = b"".join(b"X-H%d: v\r\n" % i for i in range(200))
    with connection(bounded) as s:
        s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + fields + b"\r\n")
        err = error_of(read_all(s), 431)
    assert err["code"] == "request_header_fields_too_large"


def test_an_unfinished_huge_header_is_cut_off_early(bounded: Proxy) -> None:
    """A 20 MB header that never ends: the server answers and closes once the head passes
    its limit, instead of holding what it was sent."""
    sent = 0
    with connection(bounded) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Big: ")
        try:
            while sent < 20 * 1024 * 1024:
                s.sendall(b"a" * 65536)
                sent += 65536
        except (BrokenPipeError, ConnectionResetError):
            pass
        else:
            raise AssertionError("the server read 20 MB of one header")
    assert sent < 4 * 1024 * 1024, sent
    still_serving(bounded)


def test_slow_headers_are_a_408_and_closed(bounded: Proxy) -> None:
    with connection(bounded) as s:
        t0 = time.monotonic()
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
        answer = read_all(s)
        waited = time.monotonic() - t0
    assert error_of(answer, 408)["code"] == "request_timeout"
    assert 0.5 <= waited < 5, waited


def test_a_connection_that_sends_nothing_is_closed(bounded: Proxy) -> None:
    with connection(bounded) as s:
        t0 = time.monotonic()
        assert read_all(s) == b""
        assert time.monotonic() - t0 < 5


@pytest.mark.parametrize("framing", [b"Content-Length: 100\r\n", b"Transfer-Encoding: chunked\r\n"])
def test_a_body_that_stalls_is_a_408_and_closed(bounded: Proxy, framing: bytes) -> None:
    start = b"0a\r\n" if b"chunked" in framing else b""
    with connection(bounded) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Episode-Id: "
                  + new_id("slow").encode() + b"\r\nContent-Type: application/json\r\n"
                  + framing + b"\r\n" + start + b'{"model":')
        t0 = time.monotonic()
        answer = read_all(s)
        waited = time.monotonic() - t0
    assert error_of(answer, 408)["code"] == "request_timeout"
    assert 0.5 <= waited < 5, waited
    still_serving(bounded)


def test_keep_alive_requests_within_the_limits_are_served(bounded: Proxy) -> None:
    with connection(bounded) as s:
        for _ in range(3):
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            data = b""
            while b"ok" not in data:
                data += s.recv(65536)
            assert data.startswith(b"HTTP/1.1 200 ")
            time.sleep(0.3)  # the header deadline restarts with each request


@pytest.mark.parametrize(("key", "cap"), [("max_connections_per_client", 3),
                                          ("max_connections", 3)])
def test_connections_past_a_cap_are_a_503_and_closed(proxy: ProxyFactory, key: str,
                                                    cap: int) -> None:
    capped = proxy({"server": {key: cap}}, fresh=True)
    host, port = capped.url.removeprefix("http://").split(":")
    held = [socket.create_connection((host, int(port)), timeout=10) for _ in range(cap)]
    try:
        time.sleep(0.2)
        with connection(capped) as s:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            err = error_of(read_all(s), 503)
        assert err["code"] == "too_many_connections" and key in str(err["message"])
        held.pop().close()
        time.sleep(0.2)
        with connection(capped) as s:  # one freed: served again
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert read_all(s).startswith(b"HTTP/1.1 200 ")
    finally:
        for h in held:
            h.close()


def test_a_malformed_request_is_an_openai_shaped_400(bounded: Proxy) -> None:
    with connection(bounded) as s:
        s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n")
        err = error_of(read_all(s), 400)
    assert err["code"] == "invalid_request"


class _Transport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


def test_a_response_head_leaves_with_the_write_that_follows_it() -> None:
    """One send for a head and its body; a head nothing follows goes out at the end of the
    loop's iteration, and before a close; other writes pass straight through."""
    import asyncio

    from budgetproxy.serve.http_limits import HeadWithBody

    async def go() -> None:
        t = _Transport()
        w = HeadWithBody(t, asyncio.get_running_loop())  # type: ignore[arg-type]
        head = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n"
        w.write(head)
        assert t.writes == []
        w.write(b"{}")
        assert t.writes == [head + b"{}"]
        w.write(b"5\r\nhello\r\n")  # a chunk: not held
        assert t.writes[-1] == b"5\r\nhello\r\n"
        w.write(head)
        await asyncio.sleep(0)
        assert t.writes[-1] == head  # flushed at the end of the iteration
        w.write(head)
        w.close()
        assert t.writes[-1] == head and t.closed

    asyncio.run(go())


def test_answers_on_one_kept_connection_arrive_whole(bounded: Proxy) -> None:
    """Heads held for their bodies never mix answers up on a keep-alive connection."""
    with connection(bounded) as s:
        for i in range(3):
            body = json.dumps({"model": "m1", "messages": [
                {"role": "user", "content": f"keep {i}"}]}).encode()
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
                      b"content-type: application/json\r\nx-episode-id: " +
                      new_id("kept").encode() + b"\r\ncontent-length: %d\r\n\r\n" % len(body)
                      + body)
            data = b""
            while b"\r\n\r\n" not in data:
                data += s.recv(65536)
            head, _, rest = data.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200 ")
            length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length:")))
            while len(rest) < length:
                rest += s.recv(65536)
            assert f"keep {i}" in json.loads(rest[:length])["choices"][0]["message"]["content"]


def test_a_reset_connection_leaves_no_keep_alive_timer() -> None:
    """uvicorn cancels its keep-alive timer only on a clean close; a client that resets a
    kept connection must not leave the closed connection held by a pending timer."""
    import asyncio
    import struct

    import uvicorn

    from budgetproxy.serve.http_limits import BoundedConfig, HttpLimits

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    async def go() -> None:
        limits = HttpLimits(max_header_bytes=8192, max_headers=50, header_timeout_s=5,
                            body_timeout_s=5, max_connections=100,
                            max_connections_per_client=None)
        config = BoundedConfig(app, limits=limits, host="127.0.0.1", port=0, lifespan="off",
                               log_level="warning", timeout_keep_alive=30)
        server = uvicorn.Server(config)
        serving = asyncio.create_task(server.serve())
        while not server.started:
            await asyncio.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        loop = asyncio.get_running_loop()
        s = socket.create_connection(("127.0.0.1", port))
        s.setblocking(False)
        await loop.sock_sendall(s, b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        answer = b""
        while not answer.endswith(b"ok"):
            answer += await loop.sock_recv(s, 4096)
        (protocol,) = server.server_state.connections
        assert protocol.timeout_keep_alive_task is not None  # kept alive, timer armed
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()  # a reset, not a clean close
        for _ in range(200):
            if not server.server_state.connections:
                break
            await asyncio.sleep(0.01)
        assert not server.server_state.connections
        assert protocol.timeout_keep_alive_task is None
        server.should_exit = True
        await serving

    asyncio.run(go())


class _Socketless:
    """A transport that records what is written to it, with a client address."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 40000), "sockname": ("127.0.0.1", 8080)}.get(
            name, default)

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def _served(request: bytes) -> tuple[Any, _Socketless]:
    """A BoundedProtocol (uvicorn's, extended) that has read `request` and run the app on it,
    which answers a head and a body."""
    import asyncio

    from uvicorn.server import ServerState

    from budgetproxy.serve.http_limits import BoundedConfig, BoundedProtocol, HttpLimits

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    limits = HttpLimits(max_header_bytes=8192, max_headers=50, header_timeout_s=5,
                        body_timeout_s=5, max_connections=100, max_connections_per_client=4)
    config = BoundedConfig(app, limits=limits, lifespan="off", log_level="warning")
    state = ServerState()
    protocol = BoundedProtocol(config, state, {}, asyncio.get_running_loop())
    transport = _Socketless()
    protocol.connection_made(transport)  # type: ignore[arg-type]
    protocol.data_received(request)
    await asyncio.gather(*state.tasks)
    return protocol, transport


def test_every_private_uvicorn_name_http_limits_uses_exists() -> None:
    """serve/http_limits.py builds on uvicorn's internals (UVICORN_PROTOCOL_NAMES and
    UVICORN_CYCLE_NAMES): each exists on a live protocol and its request cycle, with the
    installed uvicorn. A release that renames one fails here, naming it."""
    import asyncio

    from budgetproxy.serve.http_limits import UVICORN_CYCLE_NAMES, UVICORN_PROTOCOL_NAMES

    async def go() -> None:
        protocol, _ = await _served(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 4\r\n\r\nab")
        missing = [f"HttpToolsProtocol.{n}" for n in UVICORN_PROTOCOL_NAMES
                   if not hasattr(protocol, n)]
        cycle = protocol.cycle
        assert cycle is not None, "uvicorn's protocol keeps no request cycle in .cycle"
        missing += [f"RequestResponseCycle.{n}" for n in UVICORN_CYCLE_NAMES
                    if not hasattr(cycle, n)]
        assert not missing, f"uvicorn no longer has {', '.join(missing)}: " \
                            "serve/http_limits.py must be adapted before this release is allowed"
        protocol.connection_lost(None)

    asyncio.run(go())


def test_http_limits_uses_no_uvicorn_name_it_does_not_list() -> None:
    """Every attribute BoundedProtocol reads of its parent protocol (one it does not define
    itself) and of a request cycle is named in UVICORN_PROTOCOL_NAMES or UVICORN_CYCLE_NAMES,
    so the existence check above covers all of them."""
    import ast
    import inspect

    from budgetproxy.serve import http_limits

    tree = ast.parse(inspect.getsource(http_limits))
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "BoundedProtocol"]
    own = {n.name for n in cls.body if isinstance(n, ast.FunctionDef)}
    own |= {t.attr for n in ast.walk(cls) for t in getattr(n, "targets", [getattr(n, "target",
            None)]) if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)
            and t.value.id == "self"}
    used_protocol: set[str] = set()
    used_cycle: set[str] = set()
    for node in ast.walk(cls):
        if not isinstance(node, ast.Attribute) or node.attr.startswith("__"):
            continue
        base = node.value
        if isinstance(base, ast.Name) and base.id == "self" and node.attr not in own:
            used_protocol.add(node.attr)
        elif isinstance(base, ast.Call) and isinstance(base.func, ast.Name) \
                and base.func.id == "super":
            used_protocol.add(node.attr)
        elif (isinstance(base, ast.Name) and base.id == "cycle") or (
                isinstance(base, ast.Attribute) and base.attr == "cycle"):
            used_cycle.add(node.attr)
    unlisted = sorted(used_protocol - set(http_limits.UVICORN_PROTOCOL_NAMES))
    unlisted += sorted(f"cycle.{n}" for n in used_cycle - set(http_limits.UVICORN_CYCLE_NAMES))
    assert not unlisted, f"serve/http_limits.py uses uvicorn's {', '.join(unlisted)} unlisted"


def test_a_whole_answer_leaves_a_bounded_protocol_in_one_write() -> None:
    """With the installed uvicorn, a response's head and body reach the socket as one write
    (HeadWithBody in place of the cycle's transport): the coalescing bench/head_coalescing.py
    measures still happens."""
    import asyncio

    async def go() -> None:
        protocol, transport = await _served(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        assert len(transport.writes) == 1, transport.writes
        (answer,) = transport.writes
        assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"\r\n\r\nok")
        protocol.connection_lost(None)

    asyncio.run(go())
