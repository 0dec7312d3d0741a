"""The SSE splitter against the WHATWG event-stream rules: CRLF, LF, lone CR, mixed within a
stream, cut anywhere; every event out as soon as its blank line is in, none held back."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest
from aiohttp import web
from conftest import chat_body, new_id, read_jsonl
from hypothesis import given
from hypothesis import strategies as st

from budgetproxy.config import load_config
from budgetproxy.proxy.sse import EventSplitter, event_data
from budgetproxy.serve.local_server import LocalAiohttpServer
from budgetproxy.serve.server import ProxyServer

ENDINGS = [b"\r\n", b"\n", b"\r"]


def whatwg_events(stream: bytes) -> list[tuple[int, list[bytes]]]:
    """The reference: the spec's line reader, a byte at a time. For each event with a
    non-empty line, where its dispatching line end begins (the byte that must have arrived
    for it to be dispatched) and its data lines."""
    out: list[tuple[int, list[bytes]]] = []
    line = bytearray()
    data: list[bytes] = []
    lines = 0
    i, n = 0, len(stream)
    while i < n:
        b = stream[i]
        if b in (0x0A, 0x0D):
            at = i
            i += 2 if b == 0x0D and stream[i + 1 : i + 2] == b"\n" else 1
            if line:
                lines += 1
                if line.startswith(b"data:"):
                    value = bytes(line[5:])
                    data.append(value[1:] if value[:1] == b" " else value)
                line = bytearray()
            elif lines:
                out.append((at, data))
                data, lines = [], 0
            continue
        line.append(b)
        i += 1
    return out


def split_at(stream: bytes, cuts: list[int]) -> Iterator[tuple[int, bytes]]:
    """The stream in chunks cut at `cuts`: (bytes fed so far, chunk)."""
    edges = sorted({c % (len(stream) + 1) for c in cuts} | {0, len(stream)})
    for a, b in zip(edges, edges[1:], strict=False):
        yield b, stream[a:b]


event = st.lists(
    st.tuples(st.sampled_from([b"data: ", b"data:", b"event: x", b": comment", b"id: 7"]),
              st.binary(max_size=6).map(lambda b: b.replace(b"\r", b"").replace(b"\n", b"")),
              st.sampled_from(ENDINGS)),
    min_size=1, max_size=3)


@given(events=st.lists(st.tuples(event, st.sampled_from(ENDINGS)), min_size=1, max_size=6),
       cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=8))
def test_events_come_out_as_the_reference_reads_them_and_when_it_dispatches_them(
        events: list[tuple[list[tuple[bytes, bytes, bytes]], bytes]], cuts: list[int]) -> None:
    stream = b"".join(b"".join(f + v + e for f, v, e in lines) + blank
                      for lines, blank in events)
    expected = whatwg_events(stream)
    splitter = EventSplitter()
    got: list[bytes] = []
    passed = b""
    for fed, chunk in split_at(stream, cuts):
        out = splitter.feed(chunk)
        got += out
        passed += b"".join(out)
        due = sum(1 for at, _ in expected if at < fed)
        assert len(got) == due, (stream, fed, got)  # nothing held back, nothing early
    assert passed + splitter.rest() == stream  # the bytes go on as they came
    assert [event_data(e) or b"" for e in got] == [b"\n".join(d) for _, d in expected]


def test_a_data_line_loses_one_leading_space_as_the_spec_and_the_sdks_read_it() -> None:
    assert event_data(b"data:  {}\n\n") == b" {}"
    assert event_data(b"data:{}\r\r") == b"{}"
    assert event_data(b"data: a\r\ndata:b\r\n\r\n") == b"a\nb"


@pytest.mark.parametrize("stream", [
    b"data: a\r\n\r\ndata: b\n\ndata: c\r\rdata: d\n\r\n",  # CRLF, then LF, CR, mixed
    b"data: a\r\rdata: b\r\r",
    b"data: a\n\ndata: b\r\n\r\n",
])
def test_each_event_is_out_once_its_blank_line_is_fed(stream: bytes) -> None:
    """Each event goes out as soon as its blank line is fed, whatever line endings the events
    before it used (an LF event after a CRLF one too); a lone CR never splits."""
    splitter = EventSplitter()
    got: list[bytes] = []
    for i in range(len(stream)):
        got += splitter.feed(stream[i : i + 1])
    assert [event_data(e) for e in got] == [
        b"\n".join(d) for _, d in whatwg_events(stream)]
    assert len(got) == 4 if stream.startswith(b"data: a\r\n") else len(got) == 2


class _Mixed(LocalAiohttpServer):
    """A chat upstream whose stream changes line endings, paused before its last events
    until the test has seen the earlier ones reach the client."""

    def __init__(self) -> None:
        super().__init__()
        self.go_on = threading.Event()

    def build_app(self) -> web.Application:
        async def chat(request: web.Request) -> web.StreamResponse:
            await request.read()
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)

            def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
                return b"data: " + orjson.dumps({
                    "id": "c1", "object": "chat.completion.chunk", "created": 0,
                    "model": "m1", "choices": [{"index": 0, "delta": delta,
                                                "finish_reason": finish}]})
            await resp.write(chunk({"role": "assistant", "content": "a"}) + b"\r\n\r\n")
            await resp.write(chunk({"content": "b"}) + b"\n\n")
            await resp.write(chunk({"content": "c"}) + b"\r\r")
            for _ in range(500):  # until the client has a, b and c (or 5 s)
                if self.go_on.is_set():
                    break
                await asyncio.sleep(0.01)
            await resp.write(chunk({}, "stop") + b"\n\r\ndata: [DONE]\r\n\r\n")
            return resp

        app = web.Application()
        app.router.add_post("/v1/chat/completions", chat)
        return app


def test_a_stream_that_changes_line_endings_reaches_the_client_event_by_event(
        tmp_path: Path) -> None:
    with _Mixed() as up:
        cfg = load_config(None, {"upstreams": [{"base_url": up.base_url}],
                                 "trajectories": {"dir": str(tmp_path)}})
        with ProxyServer(cfg) as srv, httpx.Client(timeout=10) as http:
            eid = new_id("sse")
            client = openai.OpenAI(base_url=srv.url + "/v1", api_key="k", max_retries=0,
                                   default_headers={"X-Episode-Id": eid}, http_client=http)
            texts: list[str] = []
            start = time.monotonic()
            for ch in client.chat.completions.create(**chat_body(stream=True)):
                if not (ch.choices and ch.choices[0].delta.content):
                    continue
                texts.append(ch.choices[0].delta.content)
                if texts == ["a", "b", "c"]:
                    # all three arrived while the upstream still holds the rest
                    assert time.monotonic() - start < 4.0 and not up.go_on.is_set()
                    up.go_on.set()
            assert texts == ["a", "b", "c"] and up.go_on.is_set()
    (rec,) = [r for r in read_jsonl(tmp_path) if r["type"] == "turn"]
    assert rec["response"]["content"] == "abc" and rec["finish_reason"] == "stop"
