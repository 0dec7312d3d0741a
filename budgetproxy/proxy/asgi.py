"""Small pure-ASGI helpers for the hot path: read a bounded body, send a whole response."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from budgetproxy.errors import ProxyError, request_too_large

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class ClientGone(Exception):
    """The client disconnected before its request body arrived."""


async def read_body(receive: Receive, headers: dict[bytes, bytes], limit: int) -> bytes:
    declared = headers.get(b"content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise request_too_large(limit)
    msg = await receive()
    if msg["type"] == "http.disconnect":
        raise ClientGone()
    body: bytes = msg.get("body", b"")
    if not msg.get("more_body"):
        if len(body) > limit:
            raise request_too_large(limit)
        return body
    chunks = [body]
    size = len(body)
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            raise ClientGone()
        part = msg.get("body", b"")
        size += len(part)
        if size > limit:
            raise request_too_large(limit)
        chunks.append(part)
        if not msg.get("more_body"):
            return b"".join(chunks)


async def send_response(
    send: Send, status: int, headers: list[tuple[bytes, bytes]], body: bytes
) -> None:
    """A whole answer, with its length (`headers` carry none): not chunked on the wire."""
    if status != 204 and status != 304:
        headers = [*headers, (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def send_error(
    send: Send, err: ProxyError, extra: list[tuple[bytes, bytes]] | None = None,
    body: Callable[[ProxyError], bytes] | None = None,
) -> None:
    """Answer `err`; `body` writes it in the API's shape (OpenAI's when None)."""
    headers = err.header_list()
    if extra:
        headers.extend(extra)
    await send_response(send, err.status, headers, err.body() if body is None else body(err))
