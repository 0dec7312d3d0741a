"""The fake upstream's token ids and logprobs, in vLLM's or SGLang's fields and shapes.

A toy tokenizer (each word with its leading spaces is one token, its id a hash) and a toy
chat template: BOS, then per message a role token, its text's tokens and END, then the
assistant role token. A completion is its text's tokens and END, and an assistant message
sent back renders to the same tokens, so a conversation that grows append-only gives prompts
that extend the previous prompt and completion exactly, as a real template does when it
re-renders what the model said unchanged.

vLLM (`return_token_ids`, `logprobs`): a body carries `prompt_token_ids` and each choice
`token_ids`, `null` when not asked; a stream's first chunk carries `prompt_token_ids` and
each content chunk `token_ids` (its tokens). SGLang: choices carry `prompt_token_ids` (chat:
for `return_prompt_token_ids`) and `token_ids` (for `return_token_ids`) only when asked; its
chat streams carry logprobs but no token ids, and a streamed chat request asking for either
is answered 400, as SGLang does.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterator
from typing import Any

import orjson

from budgetproxy.testing.fake_text import text_of

BOS, END = 1, 2
ROLE_IDS = {"system": 3, "user": 4, "assistant": 5, "tool": 6, "developer": 7}
_PIECE = re.compile(r"\s*\S+|\s+")


def pieces(text: str) -> list[str]:
    return _PIECE.findall(text)


def token_id(piece: str) -> int:
    return 1000 + zlib.crc32(piece.encode()) % 100_000


def ids(text: str) -> list[int]:
    return [token_id(p) for p in pieces(text)]


def logprob(tid: int) -> float:
    return -((tid % 997) + 1) / 1000


def answer_text(content: Any, tool_calls: Any) -> str:
    """The text an assistant message's tokens spell: its content, then each tool call."""
    out = text_of(content)
    for tc in tool_calls if isinstance(tool_calls, list) else ():
        fn = tc.get("function") if isinstance(tc, dict) else None
        if isinstance(fn, dict):
            out += f" {fn.get('name', '')} {fn.get('arguments', '')}"
    return out


def prompt_ids(messages: Any) -> list[int]:
    out = [BOS]
    for m in messages if isinstance(messages, list) else ():
        if not isinstance(m, dict):
            continue
        out.append(ROLE_IDS.get(str(m.get("role")), 8))
        out.extend(ids(answer_text(m.get("content"), m.get("tool_calls"))))
        out.append(END)
    out.append(ROLE_IDS["assistant"])
    return out


def completion_ids(text: str) -> list[int]:
    return [*ids(text), END]


def _token_text(tid: int, piece: str | None) -> str:
    return piece if piece is not None else "<|end|>"


def chat_logprobs(tokens: list[int], texts: list[str | None], top: int) -> dict[str, Any]:
    content = []
    for tid, piece in zip(tokens, texts, strict=True):
        text = _token_text(tid, piece)
        entry = {"token": text, "logprob": logprob(tid), "bytes": list(text.encode())}
        content.append({**entry, "top_logprobs": [entry] * min(top, 1) if top else []})
    return {"content": content}


def text_logprobs(tokens: list[int], texts: list[str | None], offset: int) -> dict[str, Any]:
    offsets, pos = [], offset
    for piece in texts:
        offsets.append(pos)
        pos += len(piece or "")
    toks = [_token_text(t, p) for t, p in zip(tokens, texts, strict=True)]
    return {"text_offset": offsets, "token_logprobs": [logprob(t) for t in tokens],
            "tokens": toks, "top_logprobs": [{s: logprob(t)} for s, t in zip(toks, tokens,
                                                                           strict=True)]}


class Asked:
    """What a request asked of a token-returning server."""

    def __init__(self, req: dict[str, Any], kind: str) -> None:
        self.ids = req.get("return_token_ids") is True
        # SGLang's chat API returns prompt ids for return_prompt_token_ids
        self.prompt_ids = req.get("return_prompt_token_ids") is True
        lp = req.get("logprobs")
        self.logprobs = lp is True if kind == "chat" else type(lp) is int
        top = req.get("top_logprobs")
        self.top = top if type(top) is int else 0


def sglang_stream_refusal(req: dict[str, Any]) -> str | None:
    """SGLang's 400 message for a streamed chat request with the token-id fields it refuses
    there (serving_chat.py), or None."""
    for name in ("return_prompt_token_ids", "return_token_ids"):
        if req.get(name) is True:
            return (f"{name} is not supported with streaming. Please set stream=false when "
                    f"using {name}=true.")
    return None


def chat_body(body: dict[str, Any], req: dict[str, Any], server: str) -> dict[str, Any]:
    """A chat completion body with the fields `server` adds (choice 0 gets the tokens)."""
    asked = Asked(req, "chat")
    choice = body["choices"][0]
    msg = choice["message"]
    text = answer_text(msg.get("content"), msg.get("tool_calls"))
    toks = completion_ids(text)
    texts: list[str | None] = [*pieces(text), None]
    prompt = prompt_ids(req.get("messages"))
    if asked.logprobs:
        choice["logprobs"] = chat_logprobs(toks, texts, asked.top)
    if server == "vllm":
        choice["stop_reason"] = None
        choice["token_ids"] = toks if asked.ids else None
        body["prompt_logprobs"] = None
        body["prompt_token_ids"] = prompt if asked.ids else None
        body["kv_transfer_params"] = None
    else:
        if asked.prompt_ids:
            choice["prompt_token_ids"] = prompt
        if asked.ids:
            choice["token_ids"] = toks
    return body


def chat_events(
    events: Iterator[bytes | float], req: dict[str, Any], server: str
) -> Iterator[bytes | float]:
    """A chat stream's events with `server`'s token fields: each content chunk carries the
    tokens its text completes; tool-call streams carry theirs on the finishing chunk."""
    asked = Asked(req, "chat")
    prompt = prompt_ids(req.get("messages"))
    first = True
    text_so_far = ""
    sent_tokens = 0
    calls: dict[int, dict[str, str]] = {}
    for ev in events:
        if isinstance(ev, float) or not ev.startswith(b"data: {"):
            yield ev
            continue
        obj = orjson.loads(ev[6:])
        choices = obj.get("choices") or []
        if not choices:
            yield ev
            continue
        choice = choices[0]
        delta = choice.get("delta", {})
        finish = choice.get("finish_reason")
        text_so_far += delta.get("content") or ""
        all_pieces = pieces(text_so_far)
        # tokens whose text is complete: all but a trailing partial word, until the end
        done = len(all_pieces) if finish is not None else max(0, len(all_pieces) - 1)
        if finish is not None and not text_so_far:
            done = 0
        for tc in delta.get("tool_calls") or ():
            slot = calls.setdefault(tc.get("index", 0), {"name": "", "arguments": ""})
            fn = tc.get("function") or {}
            slot["name"] += fn.get("name") or ""
            slot["arguments"] += fn.get("arguments") or ""
        new_pieces: list[str | None] = list(all_pieces[sent_tokens:done])
        sent_tokens = max(sent_tokens, done)
        if finish is not None:
            if calls:
                new_pieces = list(pieces(answer_text(
                    None, [{"function": calls[i]} for i in sorted(calls)])))
            new_pieces.append(None)
        toks = [token_id(p) if p is not None else END for p in new_pieces]
        is_role_chunk = first
        if server == "vllm":
            if first:
                obj["prompt_token_ids"] = prompt if asked.ids else None
            if not is_role_chunk:
                choice["token_ids"] = toks if asked.ids else None
            if finish is not None:
                choice["stop_reason"] = None
        if asked.logprobs and not is_role_chunk:
            choice["logprobs"] = chat_logprobs(toks, new_pieces, asked.top)
        first = False
        yield b"data: " + orjson.dumps(obj) + b"\n\n"


def completion_body(body: dict[str, Any], req: dict[str, Any], server: str) -> dict[str, Any]:
    asked = Asked(req, "completions")
    choice = body["choices"][0]
    text = choice["text"]
    toks = completion_ids(text)
    texts: list[str | None] = [*pieces(text), None]
    prompt = [BOS, *ids(str(req.get("prompt", "")))]
    if asked.logprobs:
        choice["logprobs"] = text_logprobs(toks, texts, 0)
    if server == "vllm":
        choice["stop_reason"] = None
        choice["token_ids"] = toks if asked.ids else None
        choice["prompt_logprobs"] = None
        choice["prompt_token_ids"] = prompt if asked.ids else None
    elif asked.ids:
        choice["token_ids"] = toks
        choice["prompt_token_ids"] = prompt
    return body


def completion_events(
    events: Iterator[bytes | float], req: dict[str, Any], server: str
) -> Iterator[bytes | float]:
    """A text completion stream with token fields: the first chunk's choice carries
    `prompt_token_ids`, every chunk's choice the `token_ids` its text completes."""
    asked = Asked(req, "completions")
    prompt = [BOS, *ids(str(req.get("prompt", "")))]
    first = True
    text_so_far = ""
    sent = 0
    for ev in events:
        if isinstance(ev, float) or not ev.startswith(b"data: {"):
            yield ev
            continue
        obj = orjson.loads(ev[6:])
        choices = obj.get("choices") or []
        if not choices:
            yield ev
            continue
        choice = choices[0]
        finish = choice.get("finish_reason")
        offset = len(text_so_far)
        text_so_far += choice.get("text") or ""
        all_pieces = pieces(text_so_far)
        done = len(all_pieces) if finish is not None else max(0, len(all_pieces) - 1)
        new: list[str | None] = list(all_pieces[sent:done])
        sent = max(sent, done)
        if finish is not None:
            new.append(None)
        toks = [token_id(p) if p is not None else END for p in new]
        if asked.logprobs:
            choice["logprobs"] = text_logprobs(toks, new, offset)
        if server == "vllm":
            choice["token_ids"] = toks if asked.ids else None
            if first:
                choice["prompt_token_ids"] = prompt if asked.ids else None
        elif asked.ids:
            choice["token_ids"] = toks
            if first:
                choice["prompt_token_ids"] = prompt
        first = False
        yield b"data: " + orjson.dumps(obj) + b"\n\n"
