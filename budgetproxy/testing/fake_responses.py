"""The fake upstream's Responses API answers: a Response object, or its full event stream."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import orjson

from budgetproxy.testing.fake_text import dummy_arguments, split, text_of, words

_TOOL_OUTPUTS = ("function_call_output", "custom_tool_call_output")


def _last_text(items: list[Any]) -> tuple[str, bool]:
    """The text of the last input item, and whether it is a tool's output."""
    last = items[-1] if items and isinstance(items[-1], dict) else {}
    if last.get("type") in _TOOL_OUTPUTS:
        out = last.get("output")
        return (out if isinstance(out, str) else text_of(out)), True
    return text_of(last.get("content")), False


def answer(req: dict[str, Any], n_tools: int, echo: bool) -> list[dict[str, Any]]:
    """The output items (without ids) for a request: function calls when it offers tools and
    the last item is not a tool's output, else an assistant message echoing the last item."""
    given = req.get("input", "")
    items = given if isinstance(given, list) else [{"role": "user", "content": given}]
    text, after_tool = _last_text(items)
    tools = req.get("tools")
    if isinstance(tools, list) and tools and not after_tool and req.get("tool_choice") != "none":
        calls = []
        for i in range(max(1, n_tools)):
            tool = tools[i % len(tools)]
            tool = tool if isinstance(tool, dict) else {}
            calls.append({"type": "function_call", "call_id": f"call_{i}",
                          "name": str(tool.get("name", "tool")),
                          "arguments": dummy_arguments({"function": tool}),
                          "status": "completed"})
        return calls
    reply = orjson.dumps(items).decode() if echo else "echo: " + text
    return [{"type": "message", "status": "completed", "role": "assistant",
             "content": [{"type": "output_text", "text": reply, "annotations": [],
                          "logprobs": []}]}]


def usage_of(req: dict[str, Any], output: list[dict[str, Any]]) -> dict[str, Any]:
    given = req.get("input", "")
    items = given if isinstance(given, list) else [{"role": "user", "content": given}]
    instructions = req.get("instructions")
    prompt = sum(words(_last_text([i])[0]) for i in items) + words(
        instructions if isinstance(instructions, str) else "")
    completion = sum(words(text_of(o.get("content"))) if o["type"] == "message" else 4
                     for o in output)
    return {"input_tokens": prompt, "input_tokens_details":
            {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": completion, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + completion}


def response(rid: str, req: dict[str, Any], model: str, output: list[dict[str, Any]],
             status: str, usage: dict[str, Any] | None) -> dict[str, Any]:
    tools = req.get("tools")
    return {
        "id": rid, "object": "response", "created_at": int(time.time()), "status": status,
        "error": None, "incomplete_details": None, "instructions": req.get("instructions"),
        "model": model, "output": output, "parallel_tool_calls": True,
        "previous_response_id": req.get("previous_response_id"),
        "tool_choice": req.get("tool_choice", "auto"),
        "tools": tools if isinstance(tools, list) else [], "temperature": None,
        "top_p": None, "text": {"format": {"type": "text"}}, "truncation": "disabled",
        "usage": usage, "metadata": {},
    }


def events(body: dict[str, Any], chunks: int, gap: float) -> Iterator[bytes | float]:
    """The event stream of a finished Response `body`, every event with its sequence_number;
    texts and arguments split in `chunks` deltas `gap` seconds apart."""
    seq = 0

    def sse(kind: str, payload: dict[str, Any]) -> bytes:
        nonlocal seq
        data = orjson.dumps({"type": kind, "sequence_number": seq, **payload})
        seq += 1
        return b"event: " + kind.encode() + b"\ndata: " + data + b"\n\n"

    start = {**body, "status": "in_progress", "output": [], "usage": None}
    yield sse("response.created", {"response": start})
    yield sse("response.in_progress", {"response": start})
    for n, item in enumerate(body["output"]):
        where = {"item_id": item["id"], "output_index": n}
        if item["type"] == "message":
            yield sse("response.output_item.added", {
                "output_index": n, "item": {**item, "status": "in_progress", "content": []}})
            for c, part in enumerate(item["content"]):
                at = {**where, "content_index": c}
                yield sse("response.content_part.added",
                          {**at, "part": {**part, "text": ""}})
                for i, piece in enumerate(split(part["text"], chunks)):
                    if i:
                        yield gap
                    yield sse("response.output_text.delta",
                              {**at, "delta": piece, "logprobs": []})
                yield sse("response.output_text.done",
                          {**at, "text": part["text"], "logprobs": []})
                yield sse("response.content_part.done", {**at, "part": part})
        else:
            yield sse("response.output_item.added", {
                "output_index": n, "item": {**item, "status": "in_progress", "arguments": ""}})
            for i, piece in enumerate(split(item["arguments"], chunks)):
                if i:
                    yield gap
                yield sse("response.function_call_arguments.delta", {**where, "delta": piece})
            yield sse("response.function_call_arguments.done",
                      {**where, "name": item["name"], "arguments": item["arguments"]})
        yield sse("response.output_item.done", {"output_index": n, "item": item})
        yield gap
    yield sse("response.completed", {"response": body})
