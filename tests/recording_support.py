"""A recording upstream on raw sockets: it notes each request line exactly as it arrived (no
HTTP library between the wire and the record to normalise it) and answers every POST with a
chat completion, every GET with a model list, and any body asking for it with a redirect
(or with an answer that stalls after its first bytes)."""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Seen:
    method: str
    target: str  # the request target as sent: path and query, still percent-encoded
    headers: dict[str, str]
    body: bytes


_COMPLETION = {
    "id": "chatcmpl-rec", "object": "chat.completion", "created": 0, "model": "rec",
    "choices": [{"index": 0, "finish_reason": "stop",
                 "message": {"role": "assistant", "content": "recorded"}}],
    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
}
_MODELS = {"object": "list", "data": [{"id": "rec", "object": "model", "owned_by": "rec"}]}


@dataclass
class RecordingUpstream:
    """Start with `start()`; `base_url` ends in `base_path`; `seen` lists every request."""

    base_path: str = "/api/v1"
    seen: list[Seen] = field(default_factory=list)
    _loop: asyncio.AbstractEventLoop | None = None
    _port: int = 0
    _thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._port}{self.base_path}"

    def targets(self) -> list[str]:
        return [s.target for s in self.seen]

    def start(self) -> RecordingUpstream:
        ready = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            server = loop.run_until_complete(
                asyncio.start_server(self._serve, "127.0.0.1", 0))
            self._port = server.sockets[0].getsockname()[1]
            ready.set()
            loop.run_forever()
            server.close()
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.close()

        self._thread = threading.Thread(target=run, name="recording-upstream", daemon=True)
        self._thread.start()
        assert ready.wait(10), "recording upstream did not start"
        return self

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            if self._thread is not None:
                self._thread.join(10)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, target, _ = lines[0].split(" ", 2)
                headers = {}
                for line in lines[1:]:
                    if ":" in line:
                        k, v = line.split(":", 1)
                        headers[k.strip().lower()] = v.strip()
                body = await self._body(reader, headers)
                self.seen.append(Seen(method, target, headers, body))
                if b"please stall" in body:  # a head, part of the body, then nothing
                    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                                 b"content-length: 1000\r\n\r\n{\"id\": ")
                    await writer.drain()
                    await asyncio.sleep(3600)
                writer.write(self._answer(method, body))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ValueError,
                asyncio.CancelledError):
            pass
        finally:
            writer.close()

    @staticmethod
    async def _body(reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
        if headers.get("transfer-encoding", "").lower() == "chunked":
            parts = []
            while True:
                size = int((await reader.readuntil(b"\r\n")).strip(), 16)
                chunk = await reader.readexactly(size + 2)
                if size == 0:
                    return b"".join(parts)
                parts.append(chunk[:-2])
        return await reader.readexactly(int(headers.get("content-length", "0")))

    @staticmethod
    def _answer(method: str, body: bytes) -> bytes:
        if b"please redirect" in body:
            return (b"HTTP/1.1 307 Temporary Redirect\r\nlocation: http://127.0.0.1:9/other"
                    b"\r\ncontent-length: 0\r\n\r\n")
        data: Any = _COMPLETION if method == "POST" else _MODELS
        raw = json.dumps(data).encode()
        return (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d"
                b"\r\n\r\n" % len(raw)) + raw
