"""A simulated OpenAI-compatible model: chat completions answered by the demo's policies.

The request's model name picks the policy (``sim-careful``, ``sim-recovering``,
``sim-budget-aware``); the reply is ``move`` tool calls, one per planned move (only the first
when the request sets ``parallel_tool_calls: false``), or a short closing text once the last
message says the game is over. Each reply is
a pure function of (server seed, the request's ``seed`` field, the messages), so a run is
reproducible and two episodes that send different seeds sample differently, as a real model
at a temperature would. Streaming (SSE) is served too, for SDKs that ask for it. A request
with ``prompt_logprobs`` (vLLM's) gets them for its last message, an assistant reply, with
the policy's exact probability of that reply (``demo/policy_likelihood.py``).

Usage is counted as ``demo/tokens.py`` says (the whole prompt, tools included, every call; 15
output tokens per move call). An output cap (``max_completion_tokens`` or ``max_tokens``)
below the reply ends it early, as a real model does: only the calls that fit, finish reason
``length``.

Run it on its own with ``python -m budgetproxy.demo.model_server --port 8001``.
"""

from __future__ import annotations

import argparse
import hashlib
import random
import time
from collections.abc import Mapping
from typing import Any

import orjson
from aiohttp import web

from budgetproxy.demo.policies import (
    MODEL_PREFIX,
    POLICIES,
    decide,
    game_over,
    policy_for_model,
)
from budgetproxy.demo.policy_likelihood import prompt_logprobs
from budgetproxy.demo.tokens import CALL_TOKENS, REPLY_TOKENS, prompt_tokens, reply_tokens
from budgetproxy.serve.local_server import LocalAiohttpServer

_JSON = {"Content-Type": "application/json"}


def _error(status: int, message: str, param: str | None = None) -> web.Response:
    body = {"error": {"message": message, "type": "invalid_request_error", "param": param,
                      "code": "invalid_request"}}
    return web.Response(status=status, body=orjson.dumps(body), headers=_JSON)


def request_digest(seed: int, request_seed: Any, messages: Any) -> bytes:
    """A hash of the server seed, the request's seed field and the messages."""
    return hashlib.sha256(
        orjson.dumps([seed, request_seed, messages], option=orjson.OPT_SORT_KEYS)
    ).digest()


def reply_rng(digest: bytes) -> random.Random:
    """The policy's random source for one request."""
    return random.Random(int.from_bytes(digest[:8], "big"))


def _output_cap(body: Mapping[str, Any]) -> int | None:
    caps = [v for k in ("max_completion_tokens", "max_tokens")
            if isinstance(v := body.get(k), int) and not isinstance(v, bool)]
    return min(caps) if caps else None


def completion(seed: int, body: Mapping[str, Any]) -> dict[str, Any] | None:
    """The chat.completion for a request body, or None when the model is not simulated here."""
    model = str(body.get("model", ""))
    params = policy_for_model(model)
    if params is None:
        return None
    messages = body.get("messages") or []
    raw = request_digest(seed, body.get("seed"), messages)
    closing = game_over(messages)
    tools = body.get("tools")
    plan = [] if closing else decide(params, messages, reply_rng(raw), tools)
    if body.get("parallel_tool_calls") is False:
        plan = plan[:1]
    cap, cut = _output_cap(body), False
    if cap is not None and plan and reply_tokens(len(plan)) > cap:
        plan, cut = plan[: max(0, (cap - REPLY_TOKENS) // CALL_TOKENS)], True
    digest = raw.hex()
    tool_calls = [
        {"id": f"call_{digest[:12]}_{i}", "type": "function",
         "function": {"name": "move", "arguments": orjson.dumps({"direction": d}).decode()}}
        for i, d in enumerate(plan)
    ]
    message: dict[str, Any] = {"role": "assistant", "content": None}
    if tool_calls:
        message["tool_calls"] = tool_calls
    elif cut:
        message["content"] = ""  # the cap ended the reply before its first call
    else:
        message["content"] = closing or "I cannot find a FrozenLake map in this conversation."
    prompt = prompt_tokens([m for m in messages if isinstance(m, Mapping)], tools)
    output = reply_tokens(len(tool_calls), message["content"])
    if cap is not None:
        output = min(output, cap)
    finish = "length" if cut else "tool_calls" if tool_calls else "stop"
    return {
        "id": f"chatcmpl-{digest[:24]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message,
                     "finish_reason": finish}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": output,
                  "total_tokens": prompt + output},
    }


def _sse_chunks(reply: dict[str, Any], include_usage: bool) -> list[bytes]:
    """The reply as chat.completion.chunk events: role, one chunk per tool call, finish."""
    base = {k: reply[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
    message = reply["choices"][0]["message"]
    deltas: list[dict[str, Any]] = [{"role": "assistant", "content": message["content"]}]
    for i, call in enumerate(message.get("tool_calls") or []):
        deltas.append({"tool_calls": [{"index": i, **call}]})
    events = [base | {"choices": [{"index": 0, "delta": d, "finish_reason": None}]}
              for d in deltas]
    events.append(base | {"choices": [{"index": 0, "delta": {},
                                       "finish_reason": reply["choices"][0]["finish_reason"]}]})
    if include_usage:
        events.append(base | {"choices": [], "usage": reply["usage"]})
    return [b"data: " + orjson.dumps(e) + b"\n\n" for e in events] + [b"data: [DONE]\n\n"]


class ModelServer(LocalAiohttpServer):
    """The simulated model on 127.0.0.1, in a daemon thread with its own event loop."""

    def __init__(self, seed: int = 0, host: str = "127.0.0.1", port: int = 0) -> None:
        super().__init__(host, port)
        self.seed = seed
        self.requests = 0

    thread_name = "sim-model"

    def build_app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        return app

    async def _models(self, _: web.Request) -> web.Response:
        data = [{"id": MODEL_PREFIX + name, "object": "model", "created": 0,
                 "owned_by": "budgetproxy-demo"} for name in POLICIES]
        return web.Response(body=orjson.dumps({"object": "list", "data": data}), headers=_JSON)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            return _error(400, "Request body is not valid JSON")
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            return _error(400, "messages: expected a list", "messages")
        self.requests += 1
        reply = completion(self.seed, body)
        if reply is None:
            names = ", ".join(MODEL_PREFIX + n for n in POLICIES)
            return _error(404, f"Unknown model {body.get('model')!r}; this server has {names}",
                          "model")
        if isinstance(body.get("prompt_logprobs"), int):  # a scoring call (likelihood)
            reply["prompt_logprobs"] = prompt_logprobs(body)
        if not body.get("stream"):
            return web.Response(body=orjson.dumps(reply), headers=_JSON)
        stream_options = body.get("stream_options") or {}
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        for chunk in _sse_chunks(reply, bool(stream_options.get("include_usage"))):
            await response.write(chunk)
        await response.write_eof()
        return response


def main(argv: list[str] | None = None) -> int:
    """Serve the simulated model in the foreground until interrupted."""
    parser = argparse.ArgumentParser(prog="python -m budgetproxy.demo.model_server",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    server = ModelServer(seed=args.seed, host=args.host, port=args.port)
    print(f"simulated model on http://{args.host}:{args.port}/v1 "
          f"(models: {', '.join(MODEL_PREFIX + n for n in POLICIES)})", flush=True)
    try:
        web.run_app(server.build_app(), host=args.host, port=args.port, print=None,
                    access_log=None)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
