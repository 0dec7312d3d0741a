"""Scoring calls: the log-probability a model gives a logged reply, from what its server offers.

Two ways, both through any OpenAI-compatible URL (a proxy or the server itself):

- ``prompt_logprobs`` (vLLM): the conversation with the reply appended as the last assistant
  message, ``add_generation_prompt: false``, ``prompt_logprobs: 0``, ``max_tokens: 1``; the
  reply's tokens are those after the prompt the same conversation renders to with the
  generation prompt (a second call, ``max_tokens: 1``, whose ``usage.prompt_tokens`` counts
  them; with ``return_token_ids`` the prefix is checked token by token).
- ``echo`` (the legacy completions API): the conversation rendered as ChatML text with the
  reply after it, ``echo: true``, ``logprobs: 1``, ``max_tokens: 1``; the reply's tokens are
  those whose text overlaps the reply's characters (``text_offset``).

A reply's log-probability is the sum over its tokens, the end-of-turn token included.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

METHODS = ("prompt_logprobs", "echo")


class LikelihoodInputError(ValueError):
    """Bad input, or an upstream that cannot score text (said in one line)."""


class ScoringError(Exception):
    """One scoring call failed; counted, not fatal."""


class Unsupported(ScoringError):
    """The server answered without what the method needs (it lacks the feature)."""


@dataclass(frozen=True)
class ActionScore:
    """A reply's log-probability under one model: the sum over its tokens, and their count."""

    logprob: float
    tokens: int


def action_text(action: Mapping[str, Any]) -> str:
    """The reply as ChatML renders an assistant turn's body: its text, then each tool call as
    a ``<tool_call>`` JSON line (the Qwen convention)."""
    content = action.get("content")
    out = content if isinstance(content, str) else "".join(
        str(p.get("text", "")) for p in content or [] if isinstance(p, dict))
    for call in action.get("tool_calls") or []:
        fn = (call.get("function") or {}) if isinstance(call, dict) else {}
        args = fn.get("arguments")
        try:
            parsed = json.loads(args) if isinstance(args, str) else args
        except ValueError:
            parsed = args
        out += "\n<tool_call>\n" + json.dumps({"name": fn.get("name"), "arguments": parsed},
                                              ensure_ascii=False) + "\n</tool_call>"
    return out


def chatml(messages: Sequence[Mapping[str, Any]]) -> str:
    """The conversation as ChatML text, ending with the assistant's turn opened."""
    parts = [f"<|im_start|>{m.get('role')}\n{action_text(m)}<|im_end|>\n" for m in messages]
    return "".join(parts) + "<|im_start|>assistant\n"


def from_prompt_logprobs(entries: Any, start: int, token_ids: Any = None) -> list[float]:
    """The logprobs of the tokens from index `start` of vLLM's `prompt_logprobs` (a list of
    None or {token id: {logprob, ...}}); `token_ids` picks the prompt's own token out of an
    entry holding alternatives too."""
    if not isinstance(entries, list) or not entries:
        raise Unsupported("no prompt_logprobs in the answer")
    if not 0 < start < len(entries):
        raise ScoringError(f"the reply starts at token {start} of a {len(entries)}-token "
                           "prompt: the chat template did not render it after the prompt")
    out = []
    for i in range(start, len(entries)):
        entry = entries[i]
        if not isinstance(entry, dict) or not entry:
            raise ScoringError(f"prompt_logprobs[{i}] is not a token's logprob")
        if len(entry) == 1:
            (value,) = entry.values()
        elif isinstance(token_ids, list) and i < len(token_ids) and str(token_ids[i]) in entry:
            value = entry[str(token_ids[i])]
        else:
            raise ScoringError(f"prompt_logprobs[{i}] holds several tokens and the answer "
                               "names no prompt_token_ids to pick the prompt's own")
        lp = value.get("logprob") if isinstance(value, dict) else value
        if not isinstance(lp, int | float):
            raise ScoringError(f"prompt_logprobs[{i}] has no number")
        out.append(float(lp))
    return out


def from_echo(logprobs: Any, start: int, end: int) -> list[float]:
    """The logprobs of the echoed tokens whose text overlaps characters [start, end)."""
    if not isinstance(logprobs, dict) or not isinstance(logprobs.get("token_logprobs"), list):
        raise Unsupported("no echoed logprobs in the answer")
    offsets, tokens = logprobs.get("text_offset"), logprobs.get("tokens")
    values = logprobs["token_logprobs"]
    if not isinstance(offsets, list) or not isinstance(tokens, list) or not (
            len(offsets) == len(tokens) == len(values)):
        raise Unsupported("the echoed logprobs carry no text_offset per token")
    out = []
    for off, tok, lp in zip(offsets, tokens, values, strict=True):
        if not isinstance(off, int) or off >= end or off + len(str(tok)) <= start:
            continue
        if not isinstance(lp, int | float):
            raise ScoringError(f"no logprob for the reply's token at character {off}")
        out.append(float(lp))
    if not out:
        raise Unsupported("the echo holds none of the reply's tokens")
    return out


def _json(resp: httpx.Response, what: str) -> dict[str, Any]:
    if resp.status_code in (400, 404, 405, 422, 501):
        raise Unsupported(f"{what} answered {resp.status_code}: {_message(resp)}")
    if resp.status_code >= 300:
        raise ScoringError(f"{what} answered {resp.status_code}: {_message(resp)}")
    try:
        body = orjson.loads(resp.content)
    except orjson.JSONDecodeError:
        raise ScoringError(f"{what} answered with no JSON") from None
    if not isinstance(body, dict):
        raise ScoringError(f"{what} answered with no JSON object")
    return body


def _message(resp: httpx.Response) -> str:
    try:
        err = resp.json().get("error")
        text = err.get("message") if isinstance(err, dict) else err or resp.json().get("message")
    except (ValueError, AttributeError):
        text = None
    return str(text or resp.text[:200]).strip()


class Scorer:
    """Scores replies under models through one OpenAI-compatible base URL."""

    def __init__(self, client: httpx.AsyncClient, method: str = "auto") -> None:
        self.client = client
        self.method = method
        self.methods: dict[str, str] = {}  # model → the method that worked for it
        self.calls = 0

    async def _post(self, path: str, body: dict[str, Any]) -> httpx.Response:
        self.calls += 1
        try:
            return await self.client.post(path, content=orjson.dumps(body),
                                          headers={"Content-Type": "application/json"})
        except httpx.HTTPError as e:
            raise ScoringError(f"POST {path}: {type(e).__name__}: {e}") from None

    async def by_prompt_logprobs(self, model: str, messages: Sequence[Mapping[str, Any]],
                                 action: Mapping[str, Any]) -> ActionScore:
        reply = {"role": "assistant", "content": action.get("content")}
        if action.get("tool_calls"):
            reply["tool_calls"] = action["tool_calls"]
        common = {"model": model, "max_tokens": 1, "temperature": 0, "return_token_ids": True}
        # both at once: a server's latency, not its work, is what waits here
        prefix_resp, full_resp = await asyncio.gather(
            self._post("/chat/completions", {**common, "messages": list(messages)}),
            self._post("/chat/completions", {
                **common, "messages": [*messages, reply], "add_generation_prompt": False,
                "prompt_logprobs": 0}))
        full = _json(full_resp, "/v1/chat/completions with prompt_logprobs")
        prefix = _json(prefix_resp, "/v1/chat/completions")
        entries = full.get("prompt_logprobs")
        if entries is None:
            raise Unsupported("/v1/chat/completions answered without prompt_logprobs")
        n = (prefix.get("usage") or {}).get("prompt_tokens")
        if not isinstance(n, int):
            raise ScoringError("/v1/chat/completions answered without usage.prompt_tokens")
        head, ids = prefix.get("prompt_token_ids"), full.get("prompt_token_ids")
        if isinstance(head, list) and isinstance(ids, list) and ids[: len(head)] != head:
            raise ScoringError("the chat template renders the prompt differently once the "
                               "reply follows it: the reply's tokens cannot be told apart")
        lps = from_prompt_logprobs(entries, n, ids)
        return ActionScore(sum(lps), len(lps))

    async def by_echo(self, model: str, messages: Sequence[Mapping[str, Any]],
                      action: Mapping[str, Any]) -> ActionScore:
        head = chatml(messages)
        text = head + action_text(action) + "<|im_end|>"
        body = _json(await self._post("/completions", {
            "model": model, "prompt": text, "echo": True, "logprobs": 1, "max_tokens": 1,
            "temperature": 0}), "/v1/completions with echo")
        choices = body.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise ScoringError("/v1/completions answered without choices")
        lps = from_echo(choices[0].get("logprobs"), len(head), len(text))
        return ActionScore(sum(lps), len(lps))

    async def score(self, model: str, messages: Sequence[Mapping[str, Any]],
                    action: Mapping[str, Any]) -> ActionScore:
        """The reply's score under `model` by the method that works for it (found on the
        model's first call when the method is auto: prompt_logprobs, else echo)."""
        method = self.methods.get(model) or self.method
        if method != "auto":
            return await getattr(self, f"by_{method}")(model, messages, action)  # type: ignore[no-any-return]
        lacks = []
        for name in METHODS:
            try:
                out: ActionScore = await getattr(self, f"by_{name}")(model, messages, action)
            except Unsupported as e:
                lacks.append(f"{name}: {e}")
                continue
            self.methods[model] = name
            return out
        raise LikelihoodInputError(
            f"the upstream of model {model!r} cannot score given text ({'; '.join(lacks)}); "
            "it needs vLLM's prompt_logprobs on /v1/chat/completions or echo with logprobs "
            "on /v1/completions")
