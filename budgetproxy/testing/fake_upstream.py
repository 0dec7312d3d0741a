"""A fake OpenAI-compatible upstream: deterministic answers, fault injection, cheap per request.

Request headers steer it: ``X-Fake-Status``, ``X-Fake-Delay-Ms``,
``X-Fake-Fail-Times`` + ``X-Fake-Fail-Key``, ``X-Fake-Chunks``, ``X-Fake-Chunk-Gap-Ms``,
``X-Fake-Stream-Break-After``, ``X-Fake-Parallel-Tools``, ``X-Fake-Echo-Request`` and, on
Messages, ``X-Fake-Cache-Read`` / ``X-Fake-Cache-Write``. Chat and text completions, the
Responses API (function calls, the full event stream) and Anthropic Messages (tool_use, cache
tokens, the full event stream) answer as the real APIs do. The proxy passes these headers
upstream only when told to (``server.forward_headers: ["x-fake-*"]``).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import threading
import time
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from budgetproxy.serve.local_server import LocalAiohttpServer
from budgetproxy.testing import fake_messages, fake_responses, fake_tokens
from budgetproxy.testing.fake_text import dummy_arguments as _dummy_arguments
from budgetproxy.testing.fake_text import split as _split
from budgetproxy.testing.fake_text import text_of as _text_of
from budgetproxy.testing.fake_text import words as _words

__all__ = ["FakeUpstream", "Received", "main"]

_JSON = {"Content-Type": "application/json"}
_SSE = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
_DONE = b"data: [DONE]\n\n"
_EMBEDDING_DIM = 8


@dataclass(frozen=True, slots=True)
class Received:
    """One request as the upstream saw it."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    json: Any


def _error(status: int, message: str, type_: str, code: str | None) -> web.Response:
    body = {"error": {"message": message, "type": type_, "param": None, "code": code}}
    return web.Response(status=status, body=orjson.dumps(body), headers=_JSON)


def _fault(status: int, path: str = "") -> web.Response:
    if path.startswith("/v1/messages"):  # as Anthropic answers
        kind = {429: "rate_limit_error", 529: "overloaded_error"}.get(
            status, "api_error" if status >= 500 else "invalid_request_error")
        body = {"type": "error", "error": {"type": kind, "message": f"injected fault {status}"}}
        return web.Response(status=status, body=orjson.dumps(body), headers=_JSON)
    kind = "server_error" if status >= 500 else "invalid_request_error"
    code = "rate_limit_exceeded" if status == 429 else "fake_fault"
    return _error(status, f"injected fault {status}", kind, code)


def _int_header(request: web.Request, name: str, default: int) -> int:
    raw = request.headers.get(name)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        return default


class FakeUpstream(LocalAiohttpServer):
    """An aiohttp server on its own event loop thread, recording every request it receives."""

    def __init__(
        self,
        models: Sequence[str] = ("fake-model",),
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        chunks: int = 4,
        chunk_gap_ms: float = 0.0,
        record: bool = True,
        token_server: str | None = None,
    ) -> None:
        super().__init__(host, port)
        self.token_server = token_server  # "vllm" | "sglang": token ids as those servers
        self.models = list(models)
        self.default_chunks = max(1, chunks)
        self.default_gap_ms = chunk_gap_ms
        self.record = record
        self.requests: list[Received] = []
        self.traces_received = 0
        self.traces: list[bytes] = []  # OTLP/HTTP request bodies, when recording
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._failures: dict[str, int] = {}
        self._models_body = orjson.dumps(
            {
                "object": "list",
                "data": [
                    {"id": m, "object": "model", "created": 0, "owned_by": "fake"}
                    for m in self.models
                ],
            }
        )

    # ---- lifecycle -------------------------------------------------------------------------

    thread_name = "fake-upstream"

    def build_app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_get("/v1/models", self._list_models)
        app.router.add_post("/v1/embeddings", self._embeddings)
        app.router.add_post("/v1/responses", self._responses)
        app.router.add_post("/v1/messages", self._messages)
        app.router.add_post("/v1/messages/count_tokens", self._count_tokens)
        # An OTLP/HTTP trace sink, so benchmarks can run with tracing exported somewhere real.
        app.router.add_post("/v1/traces", self._otlp_traces)
        app.router.add_route("*", "/{tail:.*}", self._not_found)
        return app

    # ---- inspection ------------------------------------------------------------------------

    def reset(self) -> None:
        with self._lock:
            self.requests.clear()
            self.traces.clear()
            self._failures.clear()

    def count(self, path: str = "/v1/chat/completions") -> int:
        with self._lock:
            return sum(1 for r in self.requests if r.path == path)

    # ---- request plumbing ------------------------------------------------------------------

    async def _receive(self, request: web.Request) -> tuple[Any, web.Response | None]:
        """Read and record the request; return its JSON and an injected fault, if any."""
        body = await request.read()
        try:
            parsed: Any = orjson.loads(body) if body else None
        except orjson.JSONDecodeError:
            parsed = None
        if self.record:
            received = Received(
                request.method,
                request.path,
                {k.lower(): v for k, v in request.headers.items()},
                body,
                parsed,
            )
            with self._lock:
                self.requests.append(received)
        headers = request.headers
        if "X-Fake-Delay-Ms" in headers:
            await asyncio.sleep(_int_header(request, "X-Fake-Delay-Ms", 0) / 1000)
        if "X-Fake-Status" in headers or "X-Fake-Fail-Times" in headers:
            fault = self._injected_fault(request)
            if fault is not None:
                return parsed, fault
        if request.method == "POST" and not isinstance(parsed, dict):
            return parsed, _error(
                400, "request body must be a JSON object", "invalid_request_error", None
            )
        return parsed, None

    def _injected_fault(self, request: web.Request) -> web.Response | None:
        status = _int_header(request, "X-Fake-Status", 500)
        if "X-Fake-Fail-Times" not in request.headers:
            return _fault(status, request.path) if status >= 300 else None
        key = request.headers.get("X-Fake-Fail-Key", "")
        with self._lock:
            seen = self._failures.get(key, 0)
            self._failures[key] = seen + 1
        if seen < _int_header(request, "X-Fake-Fail-Times", 0):
            return _fault(status, request.path)
        return None

    def _next_id(self, prefix: str) -> str:
        return f"{prefix}-fake-{next(self._ids)}"

    def _stream_plan(self, request: web.Request) -> tuple[int, float, int | None]:
        chunks = max(1, _int_header(request, "X-Fake-Chunks", self.default_chunks))
        raw_gap = request.headers.get("X-Fake-Chunk-Gap-Ms")
        gap = float(raw_gap) if raw_gap is not None else self.default_gap_ms
        raw_break = request.headers.get("X-Fake-Stream-Break-After")
        return chunks, gap / 1000, int(raw_break) if raw_break is not None else None

    async def _sse(
        self, request: web.Request, events: Iterator[bytes | float]
    ) -> web.StreamResponse:
        """Write SSE events; a float in ``events`` is a pause in seconds."""
        _, _, break_after = self._stream_plan(request)
        resp = web.StreamResponse(headers=_SSE)
        await resp.prepare(request)
        sent = 0
        for event in events:
            if isinstance(event, float):
                if event > 0:
                    await asyncio.sleep(event)
                continue
            if break_after is not None and sent >= break_after:
                if request.transport is not None:
                    request.transport.abort()
                return resp
            await resp.write(event)
            sent += 1
        # X-Fake-Tail-Ms: keep the connection open this long after the last event (a slow close).
        tail = _int_header(request, "x-fake-tail-ms", 0)
        if tail > 0:
            await asyncio.sleep(tail / 1000)
        return resp

    # ---- chat completions ------------------------------------------------------------------

    def _chat_answer(
        self, request: web.Request, req: dict[str, Any]
    ) -> tuple[str | None, list[dict[str, Any]]]:
        """The assistant's content and tool calls for a chat request."""
        messages = req.get("messages")
        messages = messages if isinstance(messages, list) else []
        last = messages[-1] if messages and isinstance(messages[-1], dict) else {}
        tools = req.get("tools")
        if (
            isinstance(tools, list)
            and tools
            and last.get("role") != "tool"
            and req.get("tool_choice") != "none"
        ):
            n = max(1, _int_header(request, "X-Fake-Parallel-Tools", 1))
            calls = []
            for i in range(n):
                tool = tools[i % len(tools)]
                fn = tool.get("function", {}) if isinstance(tool, dict) else {}
                calls.append(
                    {
                        "id": f"call_{i}",
                        "type": "function",
                        "function": {
                            "name": str(fn.get("name", "tool")),
                            "arguments": _dummy_arguments(tool),
                        },
                    }
                )
            return None, calls
        if request.headers.get("X-Fake-Echo-Request") == "1":
            return orjson.dumps(messages).decode(), []
        return "echo: " + _text_of(last.get("content")), []

    @staticmethod
    def _prompt_tokens(messages: Any) -> int:
        if not isinstance(messages, list):
            return 0
        return sum(_words(_text_of(m.get("content"))) for m in messages if isinstance(m, dict))

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        req, fault = await self._receive(request)
        if fault is not None:
            return fault
        content, calls = self._chat_answer(request, req)
        prompt = self._prompt_tokens(req.get("messages"))
        completion = _words(content) if content is not None else 4 * len(calls)
        usage = {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }
        model = req.get("model", self.models[0])
        finish = "tool_calls" if calls else "stop"
        cid = self._next_id("chatcmpl")
        created = int(time.time())
        if req.get("stream") is True:
            server = self._tokens_of(request)
            refused = server == "sglang" and fake_tokens.sglang_stream_refusal(req)
            if refused:
                return web.Response(status=400, headers=_JSON, body=orjson.dumps(
                    {"object": "error", "message": refused, "type": "BadRequestError",
                     "param": None, "code": 400}))
            opts = req.get("stream_options")
            with_usage = isinstance(opts, dict) and opts.get("include_usage") is True
            events = self._chat_events(request, cid, created, model, content, calls, finish)
            if server is not None:
                events = fake_tokens.chat_events(events, req, server)
            return await self._sse(
                request,
                self._finish_stream(
                    events,
                    cid,
                    created,
                    model,
                    "chat.completion.chunk",
                    usage if with_usage else None,
                ),
            )
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = calls
        body = {
            "id": cid,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [
                {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
            ],
            "usage": usage,
        }
        server = self._tokens_of(request)
        if server is not None:
            body = fake_tokens.chat_body(body, req, server)
        return web.Response(body=orjson.dumps(body), headers=_JSON)

    def _tokens_of(self, request: web.Request) -> str | None:
        """Whose token fields to answer with: X-Fake-Token-Server, else the constructor's."""
        server = request.headers.get("X-Fake-Token-Server", self.token_server)
        return server if server in ("vllm", "sglang") else None

    def _chat_events(
        self,
        request: web.Request,
        cid: str,
        created: int,
        model: str,
        content: str | None,
        calls: list[dict[str, Any]],
        finish: str,
    ) -> Iterator[bytes | float]:
        chunks, gap, _ = self._stream_plan(request)
        head = b'data: {"id":"%s","object":"chat.completion.chunk","created":%d,"model":%s,' % (
            cid.encode(),
            created,
            orjson.dumps(model),
        )

        def event(delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            return head + b'"choices":' + orjson.dumps([choice]) + b"}\n\n"

        if calls:
            for i, call in enumerate(calls):
                header = {
                    "index": i,
                    "id": call["id"],
                    "type": "function",
                    "function": {"name": call["function"]["name"], "arguments": ""},
                }
                delta: dict[str, Any] = {"tool_calls": [header]}
                if i == 0:
                    delta = {"role": "assistant", "content": None, **delta}
                yield event(delta)
                for piece in _split(call["function"]["arguments"], chunks):
                    yield gap
                    yield event({"tool_calls": [{"index": i, "function": {"arguments": piece}}]})
        else:
            yield event({"role": "assistant", "content": ""})
            for i, piece in enumerate(_split(content or "", chunks)):
                if i:
                    yield gap
                yield event({"content": piece})
        yield gap
        yield event({}, finish)

    @staticmethod
    def _finish_stream(
        events: Iterator[bytes | float],
        cid: str,
        created: int,
        model: str,
        obj: str,
        usage: dict[str, int] | None,
    ) -> Iterator[bytes | float]:
        yield from events
        if usage is not None:
            last = {
                "id": cid,
                "object": obj,
                "created": created,
                "model": model,
                "choices": [],
                "usage": usage,
            }
            yield b"data: " + orjson.dumps(last) + b"\n\n"
        yield _DONE

    # ---- other endpoints -------------------------------------------------------------------

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        req, fault = await self._receive(request)
        if fault is not None:
            return fault
        prompt = req.get("prompt", "")
        if isinstance(prompt, list):
            prompt = str(prompt[0]) if prompt else ""
        text = "echo: " + str(prompt)
        p, c = _words(str(prompt)), _words(text)
        usage = {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}
        model = req.get("model", self.models[0])
        cid, created = self._next_id("cmpl"), int(time.time())

        def chunk(piece: str, finish: str | None) -> dict[str, Any]:
            return {
                "id": cid,
                "object": "text_completion",
                "created": created,
                "model": model,
                "choices": [{"text": piece, "index": 0, "logprobs": None, "finish_reason": finish}],
            }

        if req.get("stream") is True:
            chunks, gap, _ = self._stream_plan(request)
            opts = req.get("stream_options")
            with_usage = isinstance(opts, dict) and opts.get("include_usage") is True

            def events() -> Iterator[bytes | float]:
                for i, piece in enumerate(_split(text, chunks)):
                    if i:
                        yield gap
                    yield b"data: " + orjson.dumps(chunk(piece, None)) + b"\n\n"
                yield b"data: " + orjson.dumps(chunk("", "stop")) + b"\n\n"

            stream: Iterator[bytes | float] = events()
            server = self._tokens_of(request)
            if server is not None:
                stream = fake_tokens.completion_events(stream, req, server)
            return await self._sse(
                request,
                self._finish_stream(
                    stream, cid, created, model, "text_completion", usage if with_usage else None
                ),
            )
        body = chunk(text, "stop") | {"usage": usage}
        server = self._tokens_of(request)
        if server is not None:
            body = fake_tokens.completion_body(body, req, server)
        return web.Response(body=orjson.dumps(body), headers=_JSON)

    async def _list_models(self, request: web.Request) -> web.Response:
        _, fault = await self._receive(request)
        return fault or web.Response(body=self._models_body, headers=_JSON)

    async def _embeddings(self, request: web.Request) -> web.Response:
        req, fault = await self._receive(request)
        if fault is not None:
            return fault
        inputs = req.get("input", "")
        items = inputs if isinstance(inputs, list) else [inputs]
        data = []
        for i, item in enumerate(items):
            seed = zlib.crc32(orjson.dumps(item))
            vector = [((seed >> (4 * d)) & 0xF) / 15.0 for d in range(_EMBEDDING_DIM)]
            data.append({"object": "embedding", "index": i, "embedding": vector})
        tokens = sum(_words(x) if isinstance(x, str) else 1 for x in items)
        body = {
            "object": "list",
            "data": data,
            "model": req.get("model", self.models[0]),
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
        return web.Response(body=orjson.dumps(body), headers=_JSON)

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        req, fault = await self._receive(request)
        if fault is not None:
            return fault
        echo = request.headers.get("X-Fake-Echo-Request") == "1"
        output = fake_responses.answer(req, _int_header(request, "X-Fake-Parallel-Tools", 1),
                                       echo)
        for item in output:
            item["id"] = self._next_id("msg" if item["type"] == "message" else "fc")
        body = fake_responses.response(
            self._next_id("resp"), req, req.get("model", self.models[0]), output, "completed",
            fake_responses.usage_of(req, output))
        if req.get("stream") is not True:
            return web.Response(body=orjson.dumps(body), headers=_JSON)
        chunks, gap, _ = self._stream_plan(request)
        return await self._sse(request, fake_responses.events(body, chunks, gap))

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        req, fault = await self._receive(request)
        if fault is not None:
            return fault
        if not isinstance(req.get("messages"), list) or not isinstance(
                req.get("max_tokens"), int):
            body = {"type": "error", "error": {"type": "invalid_request_error",
                                               "message": "messages and max_tokens are required"}}
            return web.Response(status=400, body=orjson.dumps(body), headers=_JSON)
        echo = request.headers.get("X-Fake-Echo-Request") == "1"
        blocks, stop = fake_messages.answer(
            req, _int_header(request, "X-Fake-Parallel-Tools", 1), echo)
        usage = fake_messages.usage_of(req, blocks, _int_header(request, "X-Fake-Cache-Read", 0),
                                       _int_header(request, "X-Fake-Cache-Write", 0))
        body = fake_messages.message(self._next_id("msg"), req.get("model", self.models[0]),
                                     blocks, stop, usage)
        if req.get("stream") is not True:
            return web.Response(body=orjson.dumps(body), headers=_JSON)
        chunks, gap, _ = self._stream_plan(request)
        return await self._sse(request, fake_messages.events(body, chunks, gap))

    async def _count_tokens(self, request: web.Request) -> web.Response:
        req, fault = await self._receive(request)
        if fault is not None:
            return fault
        usage = fake_messages.usage_of(req, [], 0, 0)
        return web.Response(body=orjson.dumps({"input_tokens": usage["input_tokens"]}),
                            headers=_JSON)

    async def _otlp_traces(self, request: web.Request) -> web.Response:
        body = await request.read()
        with self._lock:
            self.traces_received += 1
            if self.record:
                self.traces.append(body)
        return web.Response(body=b"", content_type="application/x-protobuf")

    async def _not_found(self, request: web.Request) -> web.Response:
        await self._receive(request)
        return _error(
            404, f"no route {request.method} {request.path}", "invalid_request_error", "not_found"
        )


_HEADERS_HELP = """\
request headers (through budgetproxy only with server.forward_headers: ["x-fake-*"];
by default the proxy does not forward X-Fake-* headers):
  X-Fake-Status: N               answer with this status (500 if only Fail-Times is set)
  X-Fake-Fail-Times: N           fail the first N requests sharing X-Fake-Fail-Key, then answer
  X-Fake-Fail-Key: K             (with X-Fake-Fail-Times) which requests count together
  X-Fake-Delay-Ms: N             wait this long before answering
  X-Fake-Chunks: N               content chunks of a streamed answer
  X-Fake-Chunk-Gap-Ms: N         ms between streamed chunks
  X-Fake-Stream-Break-After: N   cut the connection after N stream events
  X-Fake-Parallel-Tools: N       tool calls per answer when the request offers tools
  X-Fake-Echo-Request: 1         answer with the request's messages as JSON (to see a rewrite)
  X-Fake-Cache-Read: N           Messages usage: cache_read_input_tokens (default 0)
  X-Fake-Cache-Write: N          Messages usage: cache_creation_input_tokens (default 0)
  X-Fake-Token-Server: vllm|sglang  chat/completions answer with that server's token ids and
                                 logprobs fields (return_token_ids, logprobs)
"""


def main(argv: Sequence[str] | None = None) -> int:
    """Run the fake upstream standalone (for benchmarks and manual runs)."""
    parser = argparse.ArgumentParser(
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=_HEADERS_HELP,
        prog="python -m budgetproxy.testing.fake_upstream",
        description="A fake OpenAI- and Anthropic-compatible model server: deterministic "
        "answers (it echoes the last message) to any model name, SSE streams, tool calls, "
        "fault injection by X-Fake-* "
        "request headers; it also takes OTLP/HTTP spans on POST /v1/traces. Prints its base URL.",
    )
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000,
                        help="port to listen on; 0: any free port (default 8000)")
    parser.add_argument("--model", action="append", dest="models",
                        help="a model name GET /v1/models lists; repeatable (default fake-model)")
    parser.add_argument("--chunks", type=int, default=4,
                        help="content chunks per streamed answer (default 4; X-Fake-Chunks "
                        "overrides)")
    parser.add_argument("--chunk-gap-ms", type=float, default=0.0,
                        help="ms between streamed chunks (default 0; X-Fake-Chunk-Gap-Ms "
                        "overrides)")
    parser.add_argument("--record", action="store_true", help="keep every request in memory")
    args = parser.parse_args(argv)
    upstream = FakeUpstream(
        args.models or ["fake-model"],
        args.host,
        args.port,
        chunks=args.chunks,
        chunk_gap_ms=args.chunk_gap_ms,
        record=args.record,
    )
    try:
        import uvloop
    except ImportError:
        loop = asyncio.new_event_loop()
    else:
        loop = uvloop.new_event_loop()

    async def serve() -> None:
        await upstream.start_async()
        print(upstream.base_url, flush=True)
        try:
            await asyncio.Event().wait()
        finally:
            await upstream.stop_async()

    try:
        loop.run_until_complete(serve())
    except KeyboardInterrupt:
        pass
    finally:
        loop.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
