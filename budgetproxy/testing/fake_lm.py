"""A fake language-model server whose log-probabilities are known exactly, for scoring tests.

Tokens are fake_tokens' (each word with its leading spaces is one token, its id a hash) under
fake_tokens' chat template: BOS, per message a role token, its text's tokens and END, and the
assistant role token when a generation prompt is asked for. The model is a per-model bigram
score: ``logprob(model, prev, token)`` is a fixed number in [-3, -0.001] computed from a hash
of the three (exact, deterministic, not normalised over a vocabulary: the tests need exact
values, not a distribution).

It answers what a scorer asks of vLLM: ``prompt_logprobs`` on chat completions (top level, with
``add_generation_prompt``) and text completions (in the choice), ``return_token_ids``, and the
``echo`` + ``logprobs`` text completion of the legacy API (``token_logprobs`` with ``None`` first,
``text_offset``). ``offers`` picks which of ``"prompt_logprobs"`` and ``"echo"`` it serves, so
tests can play an upstream that lacks one (unknown fields are then ignored, as many servers
do). Sampling calls get a reply of words drawn from a hash of the model and the messages, with
the sampled tokens' logprobs under the same model when asked (``logprobs: true``), so captured
logprobs equal the ones a scoring call gives.
"""

from __future__ import annotations

import re
import time
import zlib
from collections.abc import Sequence
from typing import Any

import orjson
from aiohttp import web

from budgetproxy.serve.local_server import LocalAiohttpServer
from budgetproxy.testing.fake_tokens import (
    BOS,
    END,
    ROLE_IDS,
    answer_text,
    completion_ids,
    ids,
    pieces,
    token_id,
)

_JSON = {"Content-Type": "application/json"}
WORDS = ("left", "right", "up", "down", "look", "wait", "open", "go")
_TEXT_PIECE = re.compile(r"\s*\S+|\s+")


def logprob(model: str, prev: int, token: int) -> float:
    """The model's log-probability of `token` after `prev`."""
    return -(1 + zlib.crc32(f"{model}\0{prev}\0{token}".encode()) % 3000) / 1000


def chat_ids(messages: Sequence[Any], generation_prompt: bool = True) -> list[int]:
    """The chat template's tokens (fake_tokens' template); without the generation prompt the
    last message ends the prompt, so a reply appended scores as the model would sample it."""
    out = [BOS]
    for m in messages:
        if not isinstance(m, dict):
            continue
        out.append(ROLE_IDS.get(str(m.get("role")), 8))
        out.extend(ids(answer_text(m.get("content"), m.get("tool_calls"))))
        out.append(END)
    if generation_prompt:
        out.append(ROLE_IDS["assistant"])
    return out


def sequence_logprobs(model: str, tokens: Sequence[int]) -> list[float | None]:
    """Each token's logprob given the one before; None for the first."""
    return [None, *(logprob(model, p, t) for p, t in zip(tokens, tokens[1:], strict=False))]


def text_tokens(text: str) -> list[tuple[int, str, int]]:
    """A text's (token id, piece, character offset): fake_tokens' tokenizer on raw text."""
    out, pos = [], 0
    for piece in _TEXT_PIECE.findall(text):
        out.append((token_id(piece), piece, pos))
        pos += len(piece)
    return out


def reply_words(model: str, messages: Any, seed: Any) -> str:
    """A sampled reply: 2-5 words chosen by a hash of the model, the request seed and messages."""
    h = zlib.crc32(orjson.dumps([model, seed, messages], option=orjson.OPT_SORT_KEYS))
    n = 2 + h % 4
    return " ".join(WORDS[(h >> (3 * i + 2)) % len(WORDS)] for i in range(n))


def _prompt_logprobs(model: str, tokens: Sequence[int]) -> list[Any]:
    """vLLM's prompt_logprobs: per token None (the first) or {id: {logprob, rank, decoded}}."""
    return [None if lp is None else {str(t): {"logprob": lp, "rank": 1, "decoded_token": ""}}
            for t, lp in zip(tokens, sequence_logprobs(model, tokens), strict=True)]


class FakeLM(LocalAiohttpServer):
    """The fake model on 127.0.0.1 in a thread of its own; `requests` holds every body."""

    thread_name = "fake-lm"

    def __init__(self, offers: Sequence[str] = ("prompt_logprobs", "echo"),
                 host: str = "127.0.0.1", port: int = 0) -> None:
        super().__init__(host, port)
        self.offers = set(offers)
        self.requests: list[dict[str, Any]] = []

    def build_app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._completions)
        return app

    async def _body(self, request: web.Request) -> dict[str, Any] | web.Response:
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            body = None
        if not isinstance(body, dict) or body.get("stream"):
            err = {"error": {"message": "the fake LM takes a JSON object, not streamed",
                             "type": "invalid_request_error", "param": None, "code": None}}
            return web.Response(status=400, body=orjson.dumps(err), headers=_JSON)
        self.requests.append(body)
        return body

    async def _chat(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        if isinstance(body, web.Response):
            return body
        model, messages = str(body.get("model", "")), body.get("messages") or []
        gen = body.get("add_generation_prompt", True) is not False
        prompt = chat_ids(messages, gen)
        text = reply_words(model, messages, body.get("seed"))
        toks = completion_ids(text)
        choice: dict[str, Any] = {"index": 0, "finish_reason": "stop", "logprobs": None,
                                  "message": {"role": "assistant", "content": text}}
        if body.get("logprobs") is True:
            lps = sequence_logprobs(model, [prompt[-1], *toks])[1:]
            choice["logprobs"] = {"content": [
                {"token": p or "<|end|>", "logprob": lp, "top_logprobs": []}
                for p, lp in zip([*pieces(text), None], lps, strict=True)]}
        out: dict[str, Any] = {
            "id": f"chatcmpl-lm-{len(self.requests)}", "object": "chat.completion",
            "created": int(time.time()), "model": model, "choices": [choice],
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(toks),
                      "total_tokens": len(prompt) + len(toks)},
        }
        if body.get("return_token_ids") is True:
            out["prompt_token_ids"] = prompt
            choice["token_ids"] = toks
        if "prompt_logprobs" in self.offers and isinstance(body.get("prompt_logprobs"), int):
            out["prompt_logprobs"] = _prompt_logprobs(model, prompt)
        return web.Response(body=orjson.dumps(out), headers=_JSON)

    async def _completions(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        if isinstance(body, web.Response):
            return body
        model, prompt = str(body.get("model", "")), str(body.get("prompt", ""))
        toks = text_tokens(prompt)
        text = " " + reply_words(model, prompt, body.get("seed"))
        gen = text_tokens(text)
        choice: dict[str, Any] = {"index": 0, "text": text, "finish_reason": "length",
                                  "logprobs": None}
        every = [BOS, *(t for t, _, _ in toks), *(t for t, _, _ in gen)]
        lps = sequence_logprobs(model, every)
        if "echo" in self.offers and body.get("echo") is True and type(body.get(
                "logprobs")) is int:
            choice["text"] = prompt + text
            shown = [*toks, *((t, p, o + len(prompt)) for t, p, o in gen)]
            choice["logprobs"] = {
                "tokens": [p for _, p, _ in shown], "text_offset": [o for _, _, o in shown],
                # the first prompt token's logprob is None, as the legacy API gives it
                "token_logprobs": [None, *lps[2:]],
                "top_logprobs": [None, *({p: lp} for (_, p, _), lp in zip(
                    shown[1:], lps[2:], strict=True))],
            }
        if "prompt_logprobs" in self.offers and isinstance(body.get("prompt_logprobs"), int):
            choice["prompt_logprobs"] = _prompt_logprobs(model, [BOS, *(t for t, _, _ in toks)])
        out = {"id": f"cmpl-lm-{len(self.requests)}", "object": "text_completion",
               "created": int(time.time()), "model": model, "choices": [choice],
               "usage": {"prompt_tokens": len(toks) + 1, "completion_tokens": len(gen),
                         "total_tokens": len(toks) + 1 + len(gen)}}
        return web.Response(body=orjson.dumps(out), headers=_JSON)
