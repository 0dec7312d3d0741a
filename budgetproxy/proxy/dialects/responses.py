"""The Responses API (/v1/responses): `input` items after an `instructions` head."""

from __future__ import annotations

from typing import Any

import orjson

from budgetproxy.core import disclosure
from budgetproxy.core.disclosure import Disclosed, Placement
from budgetproxy.core.prefixes import Raw
from budgetproxy.errors import ProxyError, invalid_request
from budgetproxy.proxy.dialects import responses_finish
from budgetproxy.proxy.dialects.base import (
    EMPTY_REPLY,
    Read,
    Reply,
    head_log_fields,
    read_whole,
)
from budgetproxy.proxy.sse import json_objects

_TOOL_OUTPUTS = frozenset({"function_call_output", "custom_tool_call_output",
                           "local_shell_call_output", "computer_call_output"})
_READERS = frozenset({"user", "system", "developer"})  # message roles a text may join


def _items(payload: dict[str, Any]) -> list[Any]:
    inp = payload.get("input")
    return inp if isinstance(inp, list) else [{"role": "user", "content": inp}]


def _readable(item: Any) -> bool:
    """An input item the model reads text from that the client wrote: a user, system or
    developer message, or a tool's output."""
    if not isinstance(item, dict):
        return False
    kind = item.get("type")
    if kind in _TOOL_OUTPUTS:
        return True
    return kind in (None, "message") and item.get("role") in _READERS


def _target(items: list[Any]) -> int | None:
    """The item a last_message text joins: the last readable one, when no assistant output
    follows it; None: a new user item at the end."""
    for i in range(len(items) - 1, -1, -1):
        if _readable(items[i]):
            return i
        if isinstance(items[i], dict) and items[i].get("role") == "assistant":
            return None
    return None


def _append(item: Any, text: str) -> Any:
    out = dict(item)
    key = "output" if item.get("type") in _TOOL_OUTPUTS else "content"
    value = item.get(key)
    one = disclosure.joined(value, text) if isinstance(value, list) else None
    if one is not None:
        out[key] = one
    elif isinstance(value, list):
        out[key] = [*value, {"type": "input_text", "text": text}]
    elif isinstance(value, str) and value:
        out[key] = value + "\n\n" + text
    else:
        out[key] = text
    return out


def _new(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def _text_of(parts: Any) -> str:
    if not isinstance(parts, list):
        return ""
    return "".join(p["text"] for p in parts if isinstance(p, dict)
                   and p.get("type") == "output_text" and isinstance(p.get("text"), str))


def read_response(obj: Any) -> Reply:
    """A Response object's reply: its text, function calls as tool calls, status, usage."""
    if not isinstance(obj, dict):
        return dict(EMPTY_REPLY)
    if "error" in obj and "output" not in obj:
        return {**EMPTY_REPLY, "error": obj["error"]}
    output = obj.get("output")
    items = output if isinstance(output, list) else []
    return {"message": message_of(items), "finish_reason": finish_of(obj),
            "usage": obj.get("usage")}


def message_of(items: list[Any]) -> dict[str, Any]:
    text = "".join(_text_of(i.get("content")) for i in items
                   if isinstance(i, dict) and i.get("type") == "message")
    calls = [{"id": i.get("call_id"), "type": "function",
              "function": {"name": i.get("name"), "arguments": i.get("arguments")}}
             for i in items if isinstance(i, dict) and i.get("type") == "function_call"]
    message: dict[str, Any] = {"role": "assistant", "content": text or None}
    if calls:
        message["tool_calls"] = calls
    message["output"] = items
    return message


def finish_of(obj: dict[str, Any]) -> Any:
    """The status, or why the response is incomplete (e.g. max_output_tokens)."""
    details = obj.get("incomplete_details")
    if obj.get("status") == "incomplete" and isinstance(details, dict) and details.get("reason"):
        return details["reason"]
    return obj.get("status")


class ResponsesDialect:
    kind = "responses"
    heads = 1
    items_key: str | None = "input"
    via_litellm = False
    discloses = True
    stream_usage = False  # usage arrives in response.completed

    def validate(self, payload: dict[str, Any]) -> None:
        if "input" not in payload:
            raise invalid_request("'input' is required", "input")

    def conversation(self, payload: dict[str, Any]) -> list[Any]:
        return [{"instructions": payload.get("instructions")}, *_items(payload)]

    def conversation_from(self, payload: dict[str, Any], earlier: Raw | None) -> Read:
        return read_whole(self.conversation(payload))

    def continues(self, payload: dict[str, Any]) -> str | None:
        prev = payload.get("previous_response_id")
        return prev if isinstance(prev, str) and prev else None

    def placement_index(self, placement: Placement, conversation: list[Any]) -> int | None:
        if placement == "new_message":
            return len(conversation)
        if placement == "last_message":
            t = _target(conversation[1:])
            return len(conversation) if t is None else t + 1
        return None

    def place(
        self, payload: dict[str, Any], conversation: list[Any], placement: Placement, text: str,
        again: list[tuple[int, str]], previous: Disclosed | None = None, proven: int = 0,
    ) -> tuple[dict[str, Any], Disclosed | None]:
        if placement == "system":
            instructions = payload.get("instructions")
            payload["instructions"] = (instructions + "\n\n" + text
                                       if isinstance(instructions, str) and instructions
                                       else text)
            return payload, None
        inp = payload.get("input")
        if isinstance(inp, str) and placement == "last_message":
            payload["input"] = inp + "\n\n" + text if inp else text
            return payload, None
        items = conversation[1:]
        n = len(items)
        appends: dict[int, list[str]] = {}
        inserts: dict[int, list[str]] = {}
        if placement == "last_message":
            t = _target(items)
            for idx, old in again:  # (conversation index, text): item idx - 1
                if idx - 1 == t:  # this turn's own place (a resend of it): its text is new
                    continue
                if 0 <= idx - 1 < n and _readable(items[idx - 1]):
                    appends.setdefault(idx - 1, []).append(old)
                elif idx - 1 < n:  # it was placed as a new item there
                    inserts.setdefault(max(0, idx - 1), []).append(old)
            if t is None:
                inserts.setdefault(n, []).append(text)
            else:
                appends.setdefault(t, []).append(text)
        else:
            for idx, old in sorted(again):
                i = idx - 1
                if 0 <= i < n:
                    while i < n and isinstance(items[i], dict) and (
                            items[i].get("type") in _TOOL_OUTPUTS):
                        i += 1
                    inserts.setdefault(i, []).append(old)
            inserts.setdefault(n, []).append(text)
        payload["input"] = disclosure.edit(items, appends, inserts, _append, _new)
        return payload, None

    def kept_after(self, placed: Disclosed) -> tuple[int, list[Any]]:
        raise AssertionError("place() gives no Disclosed on the Responses API")

    def read_body(self, data: bytes) -> Reply:
        try:
            return read_response(orjson.loads(data))
        except orjson.JSONDecodeError:
            return dict(EMPTY_REPLY)

    def read_parsed(self, obj: Any) -> Reply:
        return read_response(obj)

    def read_events(self, events: list[bytes]) -> Reply:
        done: dict[int, Any] = {}
        deltas: list[str] = []
        for obj in json_objects(events):
            kind = obj.get("type")
            if kind in ("response.completed", "response.incomplete", "response.failed"):
                reply = read_response(obj.get("response"))
                if reply["message"] is not None and not reply["message"]["output"] and done:
                    reply["message"] = message_of([done[i] for i in sorted(done)])
                return reply
            if kind == "response.output_item.done" and isinstance(obj.get("output_index"), int):
                done[obj["output_index"]] = obj.get("item")
            elif kind == "response.output_text.delta" and isinstance(obj.get("delta"), str):
                deltas.append(obj["delta"])
        # A stream that ended before its last event: what arrived of it.
        message = message_of([done[i] for i in sorted(done)])
        if message["content"] is None and deltas:
            message["content"] = "".join(deltas)
        return {"message": message, "finish_reason": None, "usage": None}

    def ends_stream(self, event: bytes) -> bool:
        head = event[:96]  # the `event:` line, or the data's leading "type"
        return head.find(b"response.completed") >= 0 or head.find(
            b"response.incomplete") >= 0 or head.find(b"response.failed") >= 0

    def synthetic(
        self, model: str, finish_reason: str, stream: bool, payload: dict[str, Any], text: str,
    ) -> tuple[bytes, bytes]:
        return responses_finish.reply(model, payload, stream, text)

    def error_body(self, err: ProxyError) -> bytes:
        return err.body()

    def upstream_key_header(self, api_key: str) -> tuple[str, str]:
        return "authorization", f"Bearer {api_key}"

    def log_fields(self, conversation: list[Any], seen: int) -> dict[str, Any]:
        return head_log_fields(conversation, seen, "instructions")
