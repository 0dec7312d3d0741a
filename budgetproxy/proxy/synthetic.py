"""Synthetic replies for `on_exhausted: finish`: a well-formed final assistant turn, no tools."""

from __future__ import annotations

import time
import uuid

import orjson


def _ids() -> tuple[str, int]:
    return f"chatcmpl-budget-{uuid.uuid4().hex[:24]}", int(time.time())


def chat_completion(model: str, finish_reason: str, text: str) -> bytes:
    cid, created = _ids()
    return orjson.dumps(
        {
            "id": cid,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": finish_reason,
                    "logprobs": None,
                }
            ],
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
        }
    )


def chat_completion_stream(model: str, finish_reason: str, include_usage: bool,
                           text: str) -> bytes:
    cid, created = _ids()
    base = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model}
    chunks = [
        {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                              "finish_reason": None}]},
        {**base, "choices": [{"index": 0, "delta": {"content": text},
                              "finish_reason": None}]},
        {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish_reason}]},
    ]
    if include_usage:
        chunks.append(
            {**base, "choices": [],
             "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}}
        )
    out = b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks)
    return out + b"data: [DONE]\n\n"


def text_completion(model: str, finish_reason: str, text: str) -> bytes:
    cid, created = _ids()
    return orjson.dumps(
        {
            "id": cid,
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": [
                {"index": 0, "text": text, "finish_reason": finish_reason,
                 "logprobs": None}
            ],
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
        }
    )


def text_completion_stream(model: str, finish_reason: str, text: str) -> bytes:
    cid, created = _ids()
    base = {"id": cid, "object": "text_completion", "created": created, "model": model}
    chunks = [
        {**base, "choices": [{"index": 0, "text": text, "finish_reason": None}]},
        {**base, "choices": [{"index": 0, "text": "", "finish_reason": finish_reason}]},
    ]
    out = b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks)
    return out + b"data: [DONE]\n\n"


def reply(kind: str, model: str, finish_reason: str, stream: bool,
          stream_options: object, text: str) -> tuple[bytes, bytes]:
    """The content type and body of the synthetic reply (`text`) to a chat or text completion
    call, streamed (with a usage chunk when `stream_options` asks for one) or not."""
    if stream:
        usage = isinstance(stream_options, dict) and bool(stream_options.get("include_usage"))
        data = (chat_completion_stream(model, finish_reason, usage, text) if kind == "chat"
                else text_completion_stream(model, finish_reason, text))
        return b"text/event-stream", data
    data = (chat_completion(model, finish_reason, text) if kind == "chat"
            else text_completion(model, finish_reason, text))
    return b"application/json", data
