"""Relaying an upstream SSE stream: each event goes out as it arrives, inspected on the side."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

import aiohttp

from budgetproxy.proxy.asgi import Receive, Send
from budgetproxy.proxy.sse import EventSplitter, event_data, is_usage_only
from budgetproxy.proxy.upstream import UpstreamResponse


class StreamEnd(StrEnum):
    COMPLETE = "complete"
    CLIENT_GONE = "client_gone"  # the client disconnected; the upstream call was cancelled
    BROKEN = "broken"  # the upstream failed mid-stream


@dataclass
class Relayed:
    end: StreamEnd = StreamEnd.COMPLETE
    events: list[bytes] = field(default_factory=list)  # every event, dropped ones included
    started: bool = False  # response head sent
    sent_body: bool = False  # at least one event reached the client
    first_sent_at: float | None = None  # perf_counter() of the first event sent
    done_sent: bool = False  # the stream's last event (chat's `data: [DONE]`) reached the client


class ClientLeft:
    """The relay's one cancellation, balanced in one place. When the client disconnects, the
    watcher (`_watch`) cancels the relaying task once and says so here (`cut`); as the relay
    leaves, `relay_stream` takes back exactly that one cancel (`Task.uncancel`) and reads the
    CancelledError it raised as the client gone. A cancellation it did not make (a deadline
    around the relay, the server's shutdown) is neither taken back nor caught: it passes."""

    __slots__ = ("task", "cut")

    def __init__(self, task: asyncio.Task[object] | None) -> None:
        self.task = task
        self.cut = False  # the watcher cancelled the task (once)

    def cancel(self) -> None:
        if self.task is not None:
            self.cut = True
            self.task.cancel()


async def relay_stream(
    resp: UpstreamResponse, receive: Receive, send: Send, head: list[tuple[bytes, bytes]], *,
    drop_usage: bool, ends: Callable[[bytes], bool] = lambda ev: event_data(ev) == b"[DONE]",
    transform: Callable[[bytes], bytes | None] | None = None,
) -> Relayed:
    """Send `resp`'s events to the client as they arrive, each chunk's whole events in one body
    message; nothing is held back but a partial event. With `drop_usage`, the usage-only chunk
    the proxy asked for is not passed on; `transform` rewrites each event the client gets
    (None: it gets none of it). `ends` tells the event that ends the stream in its API (chat's
    `[DONE]`, Messages' `message_stop`). A client disconnect ends the upstream read at once,
    through `ClientLeft`. On a break before any event was sent, nothing has been sent at all,
    so the caller can still answer with an error."""
    out = Relayed()
    splitter = EventSplitter()
    left = ClientLeft(asyncio.current_task())
    watcher = asyncio.create_task(_watch(receive, left))
    try:
        async for data in resp.iter_any():
            chunk = []
            for ev in splitter.feed(data):
                out.events.append(ev)
                if drop_usage and is_usage_only(ev):
                    continue
                if transform is not None:  # what the client gets of it (None: nothing)
                    out_ev = transform(ev)
                    if out_ev is not None:
                        chunk.append(out_ev)
                    continue
                chunk.append(ev)
            if not chunk:
                continue
            if not out.started:
                out.started = True
                out.first_sent_at = time.perf_counter()
                await send({"type": "http.response.start", "status": 200, "headers": head})
            await send({"type": "http.response.body", "body": b"".join(chunk), "more_body": True})
            out.sent_body = True
            if ends(chunk[-1]):
                out.done_sent = True
        rest = splitter.rest()
        if rest:
            out.events.append(rest)
        if not out.started:
            out.started = True
            await send({"type": "http.response.start", "status": 200, "headers": head})
        await send({"type": "http.response.body", "body": rest, "more_body": False})
    except asyncio.CancelledError:
        if not left.cut:  # (not ours: passes)
            raise
        # A client that hangs up once it has the last event got the whole answer.
        out.end = StreamEnd.COMPLETE if out.done_sent else StreamEnd.CLIENT_GONE
    except (TimeoutError, aiohttp.ClientError, OSError):
        watcher.cancel()  # (first: no cut while the response is ended)
        await _broken(send, out)
    finally:
        watcher.cancel()
        if left.cut:  # the watcher's one cancel, taken back
            left.task.uncancel()  # type: ignore[union-attr]
    return out


async def _watch(receive: Receive, left: ClientLeft) -> None:
    """Wait for the client's disconnect, and end the relay then (`left.cancel`)."""
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            left.cancel()
            return


async def _broken(send: Send, out: Relayed) -> None:
    """The upstream failed mid-stream: a response begun is ended where it stands."""
    out.end = StreamEnd.BROKEN
    if out.started:
        with contextlib.suppress(Exception):
            await send({"type": "http.response.body", "body": b"", "more_body": False})
