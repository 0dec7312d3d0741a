"""The final reply of an exhausted episode on /v1/responses: a Response object, or its stream."""

from __future__ import annotations

import time
import uuid
from typing import Any

import orjson


def _usage() -> dict[str, Any]:
    return {"input_tokens": 0, "input_tokens_details":
            {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": 0, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 0}


def _response(rid: str, model: str, payload: dict[str, Any], status: str,
              output: list[Any], usage: dict[str, Any] | None) -> dict[str, Any]:
    """A Response with every field the SDKs' models require; request settings echoed."""
    tools = payload.get("tools")
    return {
        "id": rid, "object": "response", "created_at": int(time.time()), "status": status,
        "background": False, "error": None, "incomplete_details": None,
        "instructions": payload.get("instructions"), "max_output_tokens":
            payload.get("max_output_tokens"), "model": model, "output": output,
        "parallel_tool_calls": payload.get("parallel_tool_calls", True),
        "previous_response_id": payload.get("previous_response_id"),
        "reasoning": {"effort": None, "summary": None}, "store": payload.get("store", True),
        "temperature": payload.get("temperature"), "text": {"format": {"type": "text"}},
        "tool_choice": payload.get("tool_choice", "auto"),
        "tools": tools if isinstance(tools, list) else [], "top_p": payload.get("top_p"),
        "truncation": "disabled", "usage": usage, "user": None, "metadata": {},
    }


def _message(mid: str, status: str, text: str | None) -> dict[str, Any]:
    content = [] if text is None else [{"type": "output_text", "text": text,
                                        "annotations": [], "logprobs": []}]
    return {"id": mid, "type": "message", "status": status, "role": "assistant",
            "content": content}


def reply(model: str, payload: dict[str, Any], stream: bool, text: str) -> tuple[bytes, bytes]:
    """A completed Response whose one output is an assistant message saying `text` (no tool
    calls, usage zeros), whole or as the event stream clients expect."""
    hexid = uuid.uuid4().hex
    rid, mid = f"resp_budget_{hexid[:24]}", f"msg_budget_{hexid[:24]}"
    done = _message(mid, "completed", text)
    final = _response(rid, model, payload, "completed", [done], _usage())
    if not stream:
        return b"application/json", orjson.dumps(final)
    start = _response(rid, model, payload, "in_progress", [], None)
    part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
    where = {"item_id": mid, "output_index": 0, "content_index": 0}
    events: list[tuple[str, dict[str, Any]]] = [
        ("response.created", {"response": start}),
        ("response.in_progress", {"response": start}),
        ("response.output_item.added",
         {"output_index": 0, "item": _message(mid, "in_progress", None)}),
        ("response.content_part.added", {**where, "part": part}),
        ("response.output_text.delta", {**where, "delta": text, "logprobs": []}),
        ("response.output_text.done", {**where, "text": text, "logprobs": []}),
        ("response.content_part.done", {**where, "part": done["content"][0]}),
        ("response.output_item.done", {"output_index": 0, "item": done}),
        ("response.completed", {"response": final}),
    ]
    out = b"".join(
        b"event: " + kind.encode() + b"\ndata: "
        + orjson.dumps({"type": kind, "sequence_number": n, **body}) + b"\n\n"
        for n, (kind, body) in enumerate(events))
    return b"text/event-stream", out
