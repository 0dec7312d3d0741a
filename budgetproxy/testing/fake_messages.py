"""The fake upstream's Anthropic Messages answers: a message, or its event stream."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson

from budgetproxy.testing.fake_text import dummy_arguments, split, text_of, words


def _last_user(messages: list[Any]) -> dict[str, Any]:
    for m in reversed(messages):
        if isinstance(m, dict) and m.get("role") == "user":
            return m
    return {}


def _has_tool_result(message: dict[str, Any]) -> bool:
    content = message.get("content")
    return isinstance(content, list) and any(
        isinstance(b, dict) and b.get("type") == "tool_result" for b in content)


def answer(req: dict[str, Any], n_tools: int, echo: bool) -> tuple[list[dict[str, Any]], str]:
    """Content blocks and stop reason: tool_use blocks when the request offers tools and the
    last user message holds no tool result, else a text block echoing that message."""
    messages = req.get("messages")
    messages = messages if isinstance(messages, list) else []
    last = _last_user(messages)
    tools = req.get("tools")
    choice = req.get("tool_choice")
    none = isinstance(choice, dict) and choice.get("type") == "none"
    if isinstance(tools, list) and tools and not _has_tool_result(last) and not none:
        blocks = []
        for i in range(max(1, n_tools)):
            tool = tools[i % len(tools)]
            tool = tool if isinstance(tool, dict) else {}
            blocks.append({"type": "tool_use", "id": f"toolu_{i}",
                           "name": str(tool.get("name", "tool")),
                           "input": orjson.loads(dummy_arguments({"function": tool}))})
        return blocks, "tool_use"
    text = orjson.dumps(messages).decode() if echo else "echo: " + text_of(last.get("content"))
    return [{"type": "text", "text": text}], "end_turn"


def usage_of(req: dict[str, Any], blocks: list[dict[str, Any]], cache_read: int,
             cache_write: int) -> dict[str, Any]:
    messages = req.get("messages")
    messages = messages if isinstance(messages, list) else []
    prompt = sum(words(text_of(m.get("content"))) for m in messages if isinstance(m, dict))
    system = req.get("system")
    prompt += words(system if isinstance(system, str) else text_of(system))
    out = sum(words(b["text"]) if b["type"] == "text" else 4 for b in blocks)
    return {"input_tokens": prompt, "cache_creation_input_tokens": cache_write,
            "cache_read_input_tokens": cache_read, "output_tokens": out}


def message(mid: str, model: str, blocks: list[dict[str, Any]], stop: str,
            usage: dict[str, Any]) -> dict[str, Any]:
    return {"id": mid, "type": "message", "role": "assistant", "model": model,
            "content": blocks, "stop_reason": stop, "stop_sequence": None, "usage": usage}


def events(body: dict[str, Any], chunks: int, gap: float) -> Iterator[bytes | float]:
    """message_start (input and cache tokens), a ping, content_block_start/delta/stop per
    block (text_delta or input_json_delta in `chunks` pieces), message_delta (stop reason,
    output tokens), message_stop."""

    def sse(payload: dict[str, Any]) -> bytes:
        kind: str = payload["type"]
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"

    usage = body["usage"]
    start = {**body, "content": [], "stop_reason": None,
             "usage": {**usage, "output_tokens": 1}}
    yield sse({"type": "message_start", "message": start})
    yield sse({"type": "ping"})
    for i, block in enumerate(body["content"]):
        if block["type"] == "text":
            yield sse({"type": "content_block_start", "index": i,
                       "content_block": {"type": "text", "text": ""}})
            pieces = [{"type": "text_delta", "text": p} for p in split(block["text"], chunks)]
        else:
            yield sse({"type": "content_block_start", "index": i,
                       "content_block": {**block, "input": {}}})
            pieces = [{"type": "input_json_delta", "partial_json": p}
                      for p in split(orjson.dumps(block["input"]).decode(), chunks)]
        for n, delta in enumerate(pieces):
            if n:
                yield gap
            yield sse({"type": "content_block_delta", "index": i, "delta": delta})
        yield sse({"type": "content_block_stop", "index": i})
    yield gap
    yield sse({"type": "message_delta",
               "delta": {"stop_reason": body["stop_reason"], "stop_sequence": None},
               "usage": {"output_tokens": usage["output_tokens"]}})
    yield sse({"type": "message_stop"})
