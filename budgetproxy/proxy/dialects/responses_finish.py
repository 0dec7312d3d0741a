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


# Request settings a Response echoes, with what it says when the request left them out.
_ECHOED: dict[str, Any] = {
    "instructions": None, "max_output_tokens": None, "max_tool_calls": None,
    "parallel_tool_calls": True, "previous_response_id": None, "prompt_cache_key": None,
    "safety_identifier": None, "service_tier": "default", "store": True, "temperature": 1.0,
    "tool_choice": "auto", "top_logprobs": 0, "top_p": 1.0, "truncation": "disabled",
}


def _tool(tool: Any) -> Any:
    """A tool as a Response lists it: a function tool with its `strict` (true unless the
    request said otherwise, as the API applies it), description and parameters."""
    if not isinstance(tool, dict) or tool.get("type") != "function":
        return tool
    return {**tool, "description": tool.get("description"),
            "parameters": tool.get("parameters"), "strict": tool.get("strict", True)}


def _settings(payload: dict[str, Any]) -> dict[str, Any]:
    """The request's settings as the Response echoes them (the API's defaults where absent;
    `user` only when sent: it is a string or missing, never null)."""
    out = {k: payload.get(k, default) for k, default in _ECHOED.items()}
    reasoning = payload.get("reasoning")
    reasoning = reasoning if isinstance(reasoning, dict) else {}
    text = payload.get("text")
    text = text if isinstance(text, dict) else {}
    metadata = payload.get("metadata")
    tools = payload.get("tools")
    out.update(
        background=payload.get("background") is True,
        reasoning={"effort": reasoning.get("effort"), "summary": reasoning.get("summary")},
        text={"format": {"type": "text"}, "verbosity": "medium", **text},
        metadata=metadata if isinstance(metadata, dict) else {},
        tools=[_tool(t) for t in tools] if isinstance(tools, list) else [],
    )
    if isinstance(payload.get("user"), str):
        out["user"] = payload["user"]
    return out


def _response(rid: str, model: str, settings: dict[str, Any], status: str,
              output: list[Any], usage: dict[str, Any] | None) -> dict[str, Any]:
    """A Response with every field the API's schema requires, request settings echoed
    (`usage` once it is known: the schema has no null for it)."""
    out = {
        "id": rid, "object": "response", "created_at": int(time.time()), "status": status,
        "error": None, "incomplete_details": None, "model": model, "output": output,
        **settings,
    }
    if usage is not None:
        out["usage"] = usage
    return out


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
    settings = _settings(payload)
    final = _response(rid, model, settings, "completed", [done], _usage())
    if not stream:
        return b"application/json", orjson.dumps(final)
    start = _response(rid, model, settings, "in_progress", [], None)
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
