"""Server-sent events: split an upstream stream into events and read a reply back from them."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import orjson


class EventSplitter:
    """Cuts a byte stream into whole SSE events, each as soon as its blank line arrives.

    Lines end in CRLF, LF or a lone CR, mixed as they come (the WHATWG event-stream rules);
    an event ends at an empty line that follows one of its lines. Events are returned as
    the bytes that came (what they and `rest()` return, joined, is the stream).
    """

    __slots__ = ("_buf", "_lf_owed")

    def __init__(self) -> None:
        self._buf = b""
        # The stream's last byte ended an event with a CR: an LF next belongs to that CR.
        self._lf_owed = False

    def feed(self, data: bytes) -> list[bytes]:
        buf = self._buf + data if self._buf else data
        # (find, not `in`: `in` on bytes first reads its needle as an integer, and raises and
        # clears a TypeError when it is bytes; per event that is most of the test's cost)
        if self._lf_owed or buf.find(b"\r") >= 0:
            if not self._lf_owed and (
                    buf.count(b"\r") == buf.count(b"\r\n") == buf.count(b"\n")):  # CRLF only
                return self._cut(buf, b"\r\n\r\n")
            return self._scan(buf)
        # LF line ends only, the common stream: cut by find, here (no call per chunk)
        events: list[bytes] = []
        start = 0
        while True:
            end = buf.find(b"\n\n", start)
            if end < 0:
                break
            events.append(buf[start : end + 2])
            start = end + 2
        self._buf = buf[start:]
        return events

    def _cut(self, buf: bytes, sep: bytes) -> list[bytes]:
        events: list[bytes] = []
        start = 0
        while True:
            end = buf.find(sep, start)
            if end < 0:
                break
            events.append(buf[start : end + len(sep)])
            start = end + len(sep)
        self._buf = buf[start:]
        return events

    def _scan(self, buf: bytes) -> list[bytes]:
        """Line by line, for streams with lone CRs or line ends that change."""
        events: list[bytes] = []
        n = len(buf)
        start = line = 0
        if self._lf_owed and buf[:1] == b"\n":
            line = 1  # the end of the CR that ended the previous event
        self._lf_owed = False
        lines = False  # the event so far has a line that is not empty
        while line < n:
            lf = buf.find(b"\n", line)
            cr = buf.find(b"\r", line, lf if lf >= 0 else n)
            if cr >= 0:
                nl = cr
                end = cr + 2 if buf[cr + 1 : cr + 2] == b"\n" else cr + 1
            elif lf >= 0:
                nl, end = lf, lf + 1
            else:
                break
            if nl > line:
                lines = True
            elif lines:  # an empty line ends the event
                events.append(buf[start:end])
                start, lines = end, False
                self._lf_owed = end == n and buf[nl] == 0x0D
            line = end
        self._buf = buf[start:]
        return events

    def rest(self) -> bytes:
        out, self._buf = self._buf, b""
        return out


def event_data(event: bytes) -> bytes | None:
    """The data payload of one event (data lines joined, each without the one space that may
    follow its colon), or None."""
    parts = [
        line[6:] if line[5:6] == b" " else line[5:]
        for line in event.splitlines() if line.startswith(b"data:")
    ]
    if not parts:
        return None
    return b"\n".join(parts)


def json_objects(events: Iterable[bytes]) -> Iterator[dict[str, Any]]:
    """The JSON objects the events carry, in order: `[DONE]`, comments, bodies that are not
    JSON and JSON that is not an object are passed over (upstreams are not all well-formed)."""
    for event in events:
        data = event_data(event)
        if data is None or data == b"[DONE]":
            continue
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            continue
        if isinstance(obj, dict):
            yield obj


def is_usage_only(event: bytes) -> bool:
    """An OpenAI usage-only chunk: `"choices": []` plus `usage` (sent for include_usage)."""
    if event.find(b'"usage"') < 0 or event.find(b'"choices"') < 0:
        return False
    data = event_data(event)
    if data is None:
        return False
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        return False
    return isinstance(obj, dict) and obj.get("choices") == [] and bool(obj.get("usage"))


def assemble(events: list[bytes]) -> dict[str, Any]:
    """Rebuild {message, finish_reason, usage} from chat or text-completion chunks."""
    content: list[str] = []
    tool_calls: dict[int, dict[str, Any]] = {}
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    role = "assistant"
    for obj in json_objects(events):
        if isinstance(obj.get("usage"), dict):
            usage = obj["usage"]
        choices = obj.get("choices")
        # Upstreams are not all well-formed: every field is type-checked before it is used.
        for choice in choices if isinstance(choices, list) else ():
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            if isinstance(choice.get("finish_reason"), str):
                finish_reason = choice["finish_reason"]
            if isinstance(choice.get("text"), str):
                content.append(choice["text"])
            delta = choice.get("delta")
            if not isinstance(delta, dict):
                continue
            if isinstance(delta.get("role"), str):
                role = delta["role"]
            if isinstance(delta.get("content"), str):
                content.append(delta["content"])
            calls = delta.get("tool_calls")
            for tc in calls if isinstance(calls, list) else ():
                if not isinstance(tc, dict):
                    continue
                index = tc.get("index", 0)
                slot = tool_calls.setdefault(
                    index if type(index) is int else 0,
                    {"id": None, "type": "function", "function": {"name": "", "arguments": ""}},
                )
                if isinstance(tc.get("id"), str):
                    slot["id"] = tc["id"]
                fn = tc.get("function")
                if not isinstance(fn, dict):
                    continue
                if isinstance(fn.get("name"), str):
                    slot["function"]["name"] += fn["name"]
                if isinstance(fn.get("arguments"), str):
                    slot["function"]["arguments"] += fn["arguments"]
    message: dict[str, Any] = {"role": role, "content": "".join(content) if content else None}
    if tool_calls:
        message["tool_calls"] = [tool_calls[i] for i in sorted(tool_calls)]
    return {"message": message, "finish_reason": finish_reason, "usage": usage}
