"""Replaying a state in the API it came from: the disclosure placed as the proxy placed it,
the request body of each dialect, and the reply read back as one action shape.

Chat completions, Anthropic Messages and OpenAI Responses are replayed on their own routes,
so states from Claude Code (Messages), Codex and the Agents SDK (Responses) are probed as
they were served. The disclosure text goes where the proxy's placement put it (`history:
keep`: earlier turns' texts stay where they were). `last_message`: on chat, the last message;
on Messages, a text block on the last user message; on Responses, the last item the model
reads that the client wrote (a user, system or developer message, or a tool's output), or a
new user item when an assistant output follows it. `system`: the system prompt or the
instructions. `new_message`: a user item of its own (on Messages, joined to an adjacent user
message). The rules mirror the proxy's dialects, which the probe does not import (it talks
to a proxy over HTTP only); tests/probe/test_probe_dialects.py holds them to what the
upstream saw.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from budgetproxy.core import disclosure

CHAT, MESSAGES, RESPONSES = "/v1/chat/completions", "/v1/messages", "/v1/responses"
ROUTES = (CHAT, MESSAGES, RESPONSES)
HEADS = {MESSAGES: "system", RESPONSES: "instructions"}  # the head field each logs
MAX_TOKENS = 1024  # Messages requires max_tokens
_TOOL_OUTPUTS = frozenset({"function_call_output", "custom_tool_call_output",
                           "local_shell_call_output", "computer_call_output"})


def route_of(record: dict[str, Any]) -> str:
    """The route a turn record was served on; records of older versions are chat's."""
    route = record.get("route")
    return route if route in ROUTES else CHAT


def _role(item: Any) -> Any:
    return item.get("role") if isinstance(item, dict) else None


def _target(route: str, items: Sequence[Any]) -> int | None:
    """The item this turn's text joins; None: a new user item at the end."""
    if route == CHAT:
        return len(items) - 1 if items else None
    for i in range(len(items) - 1, -1, -1):
        item = items[i]
        if _readable(route, item):
            return i
        if _role(item) == "assistant":
            return None
    return None


def _readable(route: str, item: Any) -> bool:
    if route == MESSAGES:
        return bool(_role(item) == "user")
    if not isinstance(item, dict):
        return False
    kind = item.get("type")
    return bool(kind in _TOOL_OUTPUTS or (kind in (None, "message")
                                          and item.get("role") in ("user", "system", "developer")))


def _append(route: str, item: dict[str, Any], text: str) -> dict[str, Any]:
    if route == CHAT:
        return disclosure.apply([item], "last_message", text)[0]  # type: ignore[no-any-return]
    out = dict(item)
    if route == MESSAGES:  # a text block, after any tool_result blocks
        content, block = item.get("content"), {"type": "text", "text": text}
        if isinstance(content, list):
            out["content"] = [*content, block]
        elif isinstance(content, str) and content:
            out["content"] = [{"type": "text", "text": content}, block]
        else:
            out["content"] = [block]
        return out
    key = "output" if item.get("type") in _TOOL_OUTPUTS else "content"
    value = item.get(key)
    if isinstance(value, list):
        out[key] = [*value, {"type": "input_text", "text": text}]
    elif isinstance(value, str) and value:
        out[key] = value + "\n\n" + text
    else:
        out[key] = text
    return out


def _new(route: str, text: str) -> dict[str, Any]:
    if route == MESSAGES:
        return {"role": "user", "content": [{"type": "text", "text": text}]}
    return {"role": "user", "content": text}


PLACEMENTS = ("last_message", "system", "new_message")


def place(
    route: str, items: Sequence[Any], head: Any, text: str,
    placed: Sequence[tuple[int, str]], placement: str = "last_message",
) -> tuple[list[Any], Any, list[tuple[int, str]]]:
    """What the model saw under the proxy's `placement`: the items and the head (system or
    instructions) with this turn's text placed and earlier turns' texts (`placed`: item
    index, text) re-applied where they were (`history: keep`); and the placements to carry
    to the next turn."""
    if placement == "system":  # not replayed: each turn's text alone, on the system prompt
        if route == CHAT:
            return disclosure.apply(list(items), "system", text), head, []
        return list(items), _with_head(route, head, text), []
    if placement == "new_message":
        return _new_message(route, items, text, placed), head, [
            *[(i, t) for i, t in placed if i < len(items)], (len(items), text)]
    if route == CHAT:
        seen = disclosure.apply(list(items), "last_message", text, placed)
        return seen, head, [*[p for p in placed if p[0] < len(items) - 1],
                            (len(items) - 1, text)]
    seen, carried = _last_message(route, items, text, placed)
    return seen, head, carried


def _with_head(route: str, head: Any, text: str) -> Any:
    if route == MESSAGES and isinstance(head, list):
        return [*head, {"type": "text", "text": text}]
    return head + "\n\n" + text if isinstance(head, str) and head else text


def _new_message(
    route: str, items: Sequence[Any], text: str, placed: Sequence[tuple[int, str]]
) -> list[Any]:
    """New-message placement: each text a user item where it was put (on Messages, joining
    a user message next to it: two user messages in a row are refused; on chat and
    Responses, after any tool outputs there)."""
    if route == CHAT:
        return disclosure.apply(list(items), "new_message", text, placed)
    n = len(items)
    appends: dict[int, list[str]] = {}
    inserts: dict[int, list[str]] = {}

    def put(at: int, t: str) -> None:
        if route == MESSAGES and at - 1 >= 0 and _role(items[at - 1]) == "user":
            appends.setdefault(at - 1, []).append(t)
        elif route == MESSAGES and at < n and _role(items[at]) == "user":
            appends.setdefault(at, []).append(t)
        else:
            while route == RESPONSES and at < n and isinstance(items[at], dict) and (
                    items[at].get("type") in _TOOL_OUTPUTS):
                at += 1
            inserts.setdefault(at, []).append(t)

    for idx, old in sorted(placed):
        if 0 <= idx < n:
            put(idx, old)
    put(n, text)
    out: list[Any] = []
    for i in range(n + 1):
        out += [_new(route, t) for t in inserts.get(i, ())]
        if i < n:
            item = items[i]
            for t in appends.get(i, ()):
                item = _append(route, item, t)
            out.append(item)
    return out


def _last_message(
    route: str, items: Sequence[Any], text: str, placed: Sequence[tuple[int, str]]
) -> tuple[list[Any], list[tuple[int, str]]]:
    out = list(items)
    target = _target(route, out)
    for idx, old in placed:
        if idx != target and 0 <= idx < len(out) and isinstance(out[idx], dict):
            out[idx] = _append(route, out[idx], old)
    if target is None:
        out.append(_new(route, text))
        at = len(items)
    else:
        out[target] = _append(route, out[target], text)
        at = target
    keep = [(i, t) for i, t in placed if i < at]
    return out, [*keep, (at, text)]


def body(route: str, messages: Sequence[Any], head: Any, model: str, seed: int,
         tools: list[Any] | None) -> dict[str, Any]:
    """The request a state replays as, on its own route (`tools` in that API's shape)."""
    out: dict[str, Any] = {"model": model}
    if route == MESSAGES:
        out.update(messages=list(messages), max_tokens=MAX_TOKENS)
        if head is not None:
            out["system"] = head
    elif route == RESPONSES:
        out.update(input=list(messages), store=False)
        if head is not None:
            out["instructions"] = head
    else:
        out.update(messages=list(messages), seed=seed)
    if tools:
        out["tools"] = tools
    return out


def action_of(route: str, reply: Any) -> dict[str, Any] | None:
    """A Messages or Responses reply as the chat-shaped action scorers take:
    `{"role": "assistant", "content": text or None, "tool_calls": [...]}`."""
    if not isinstance(reply, dict):
        return None
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    if route == MESSAGES:
        for b in reply.get("content") or []:
            if not isinstance(b, dict):
                continue
            if b.get("type") == "text" and isinstance(b.get("text"), str):
                texts.append(b["text"])
            elif b.get("type") == "tool_use":
                calls.append(_call(b.get("id"), b.get("name"), json.dumps(b.get("input"))))
    else:
        for item in reply.get("output") or []:
            if not isinstance(item, dict):
                continue
            if item.get("type") == "message":
                texts += [p["text"] for p in item.get("content") or [] if isinstance(p, dict)
                          and p.get("type") == "output_text" and isinstance(p.get("text"), str)]
            elif item.get("type") == "function_call":
                calls.append(_call(item.get("call_id"), item.get("name"),
                                   item.get("arguments")))
    out: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or None}
    if calls:
        out["tool_calls"] = calls
    return out


def _call(call_id: Any, name: Any, arguments: Any) -> dict[str, Any]:
    return {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": arguments}}
