"""Providers beyond OpenAI's API through litellm: an optional extra, lazily imported.

A `kind: litellm` upstream calls `litellm.acompletion` with the upstream's `model` (e.g.
`anthropic/claude-sonnet-4-5`, or `openai/<name>` with `base_url`), and answers in OpenAI's
chat-completion shape. Streams are collected and sent as one SSE body: litellm upstreams
trade streaming latency for reach.
"""

from __future__ import annotations

import os
from typing import Any

import orjson

from budgetproxy.config import UpstreamConfig

_PASS = ("temperature", "top_p", "max_tokens", "max_completion_tokens", "stop", "tools",
         "tool_choice", "parallel_tool_calls", "n", "seed", "response_format", "user",
         "presence_penalty", "frequency_penalty", "logprobs", "top_logprobs")


def _error(status: int, message: str, code: str) -> tuple[int, bytes]:
    return status, orjson.dumps({"error": {"message": message, "type": "upstream_error",
                                           "param": None, "code": code}})


async def call_litellm(
    upstream: UpstreamConfig, payload: dict[str, Any], stream: bool
) -> tuple[int, bytes]:
    # Use the cost map shipped in the package; never fetch it over the network at import.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    try:
        import litellm
    except ImportError:
        return _error(502, "This upstream needs litellm: pip install 'budgetproxy[litellm]'",
                      "litellm_not_installed")
    model = upstream.model or payload["model"]
    kwargs: dict[str, Any] = {k: payload[k] for k in _PASS if k in payload}
    if upstream.base_url:
        kwargs["api_base"] = upstream.base_url
    if upstream.api_key:
        kwargs["api_key"] = upstream.api_key
    try:
        if stream:
            chunks = await litellm.acompletion(model=model, messages=payload["messages"],
                                               stream=True, timeout=upstream.timeout_s,
                                               stream_options={"include_usage": True}, **kwargs)
            parts = []
            async for chunk in chunks:
                data = chunk.model_dump(exclude_none=True)
                data["model"] = payload["model"]
                parts.append(b"data: " + orjson.dumps(data) + b"\n\n")
            return 200, b"".join(parts) + b"data: [DONE]\n\n"
        resp = await litellm.acompletion(model=model, messages=payload["messages"],
                                         timeout=upstream.timeout_s, **kwargs)
        data = resp.model_dump(exclude_none=True)
        data["model"] = payload["model"]
        return 200, orjson.dumps(data)
    except Exception as e:  # litellm raises its own exception tree; map by status
        status = int(getattr(e, "status_code", 502) or 502)
        return _error(status if 400 <= status < 600 else 502, f"litellm: {e}", "litellm_error")
