"""The final reply of an exhausted episode on /v1/messages: a message, or its event stream."""

from __future__ import annotations

import uuid
from typing import Any

import orjson

# A configured finish_reason that is one of these is the stop reason; any other (the default
# "length" among them) answers end_turn: agents take max_tokens as a failure and retry.
STOP_REASONS = frozenset({"end_turn", "max_tokens", "stop_sequence", "refusal", "pause_turn"})


def stop_reason(finish_reason: str) -> str:
    return finish_reason if finish_reason in STOP_REASONS else "end_turn"


def _usage() -> dict[str, Any]:
    return {"input_tokens": 0, "output_tokens": 0, "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0}


def reply(model: str, finish_reason: str, stream: bool, text: str) -> tuple[bytes, bytes]:
    """An assistant message with one text block, `text` (no tool use),
    whole or as message_start, content_block_start/delta/stop, message_delta, message_stop."""
    mid = f"msg_budget_{uuid.uuid4().hex[:24]}"
    stop = stop_reason(finish_reason)
    message = {"id": mid, "type": "message", "role": "assistant", "model": model,
               "content": [{"type": "text", "text": text}], "stop_reason": stop,
               "stop_sequence": None, "usage": _usage()}
    if not stream:
        return b"application/json", orjson.dumps(message)
    events: list[dict[str, Any]] = [
        {"type": "message_start", "message": {**message, "content": [], "stop_reason": None}},
        {"type": "content_block_start", "index": 0,
         "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0,
         "delta": {"type": "text_delta", "text": text}},
        {"type": "content_block_stop", "index": 0},
        {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
         "usage": {"output_tokens": 0}},
        {"type": "message_stop"},
    ]
    out = b"".join(b"event: " + e["type"].encode() + b"\ndata: " + orjson.dumps(e) + b"\n\n"
                   for e in events)
    return b"text/event-stream", out
