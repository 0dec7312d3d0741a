"""Anthropic Messages (/v1/messages): `messages` after a `system` head, cache markers aside."""

from __future__ import annotations

import bisect
from typing import Any

import orjson

from budgetproxy.core import disclosure
from budgetproxy.core.disclosure import Disclosed, Placement
from budgetproxy.core.prefixes import Raw
from budgetproxy.errors import ProxyError
from budgetproxy.proxy.dialects import messages_finish
from budgetproxy.proxy.dialects.base import EMPTY_REPLY, Read, Reply, head_log_fields
from budgetproxy.proxy.dialects.chat import check_messages
from budgetproxy.proxy.sse import json_objects


def _unmarked(value: Any) -> Any:
    """A message or system prompt without its `cache_control` markers (blocks and the blocks
    of tool results): clients move them to the newest message every turn, which is no change
    to the conversation. Objects without markers are the client's own. (Every call walks its
    whole history with this: a list is copied only where something in it changed.)"""
    kind = type(value)
    if kind is dict:
        return _unmarked_dict(value)
    if kind is not list:
        return value
    out: list[Any] | None = None
    for i, item in enumerate(value):
        if type(item) is dict:
            new = _unmarked_dict(item)
        elif type(item) is list:
            new = _unmarked(item)
        else:
            continue
        if new is not item:
            if out is None:
                out = value.copy()
            out[i] = new
    return value if out is None else out


def _unmarked_dict(value: dict[str, Any]) -> dict[str, Any]:
    content = value.get("content")
    inner = _unmarked(content) if type(content) is list else content
    if "cache_control" not in value:
        if inner is content:
            return value
        out = value.copy()
        out["content"] = inner
        return out
    out = {k: v for k, v in value.items() if k != "cache_control"}
    if inner is not content:
        out["content"] = inner
    return out


def _unmarked_message(message: Any) -> Any:
    """`_unmarked` of one message, looking at most messages' blocks in one loop: a message
    with no marker and no block with a content list of its own is the client's object."""
    if type(message) is not dict or "cache_control" in message:
        return _unmarked(message)
    content = message.get("content")
    if type(content) is not list:
        return message
    for block in content:
        kind = type(block)
        if kind is list or (kind is dict and ("cache_control" in block
                                              or type(block.get("content")) is list)):
            return _unmarked_dict(message)
    return message


def _is_user(m: Any) -> bool:
    return isinstance(m, dict) and m.get("role") == "user"


def _last_user(messages: list[Any]) -> int | None:
    """The last user message (Claude Code may put a `system` message after it)."""
    for i in range(len(messages) - 1, -1, -1):
        if _is_user(messages[i]):
            return i
        if isinstance(messages[i], dict) and messages[i].get("role") == "assistant":
            return None
    return None


def _append(message: Any, text: str) -> Any:
    """A text block added to a user message, after its tool_result blocks."""
    out = dict(message)
    content = message.get("content")
    block = {"type": "text", "text": text}
    if isinstance(content, list):
        out["content"] = [*content, block]
    elif isinstance(content, str) and content:
        out["content"] = [{"type": "text", "text": content}, block]
    else:
        out["content"] = [block]
    return out


def _new(text: str) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "text", "text": text}]}


def _system_with(system: Any, text: str) -> Any:
    if isinstance(system, list):
        return [*system, {"type": "text", "text": text}]
    if isinstance(system, str) and system:
        return system + "\n\n" + text
    return text


def read_message(obj: Any) -> Reply:
    """A message object's reply: text, tool_use blocks as tool calls, stop reason, usage."""
    if not isinstance(obj, dict):
        return dict(EMPTY_REPLY)
    if obj.get("type") == "error":
        return {**EMPTY_REPLY, "error": obj.get("error")}
    content = obj.get("content")
    blocks = content if isinstance(content, list) else []
    return {"message": message_of(blocks), "finish_reason": obj.get("stop_reason"),
            "usage": obj.get("usage")}


def message_of(blocks: list[Any]) -> dict[str, Any]:
    text = "".join(b["text"] for b in blocks if isinstance(b, dict)
                   and b.get("type") == "text" and isinstance(b.get("text"), str))
    calls = [{"id": b.get("id"), "type": "function",
              "function": {"name": b.get("name"), "arguments": orjson.dumps(
                  b.get("input", {})).decode()}}
             for b in blocks if isinstance(b, dict) and b.get("type") == "tool_use"]
    message: dict[str, Any] = {"role": "assistant", "content": text or None}
    if calls:
        message["tool_calls"] = calls
    message["content_blocks"] = blocks
    return message


def _merge_usage(usage: dict[str, Any], more: Any) -> None:
    if isinstance(more, dict):
        usage.update({k: v for k, v in more.items() if v is not None})


class MessagesDialect:
    kind = "messages"
    heads = 1
    items_key: str | None = "messages"
    via_litellm = False
    discloses = True
    stream_usage = False  # message_start and message_delta carry usage

    def validate(self, payload: dict[str, Any]) -> None:
        check_messages(payload)

    def conversation(self, payload: dict[str, Any]) -> list[Any]:
        return [{"system": _unmarked(payload.get("system"))},
                *[_unmarked_message(m) for m in payload["messages"]]]

    def conversation_from(self, payload: dict[str, Any], earlier: Raw | None) -> Read:
        """The conversation, reading only the messages after those `earlier` proves: the body's
        system prompt and messages, markers and all, written in C as `[system,[m0,m1,..`,
        start with its bytes up to a message boundary. Every message but the newest is then
        the one read last turn (Claude Code moves its marker off the newest): looking at each
        one's markers again would make each call's work grow with the history."""
        system, messages = payload.get("system"), payload["messages"]
        try:
            raw = orjson.dumps([system, messages])
            last = len(orjson.dumps(messages[-1]))
        except (TypeError, ValueError):  # nesting past orjson's depth: read whole, none kept
            return Read(self.conversation(payload), None, 0)
        proven = 0
        conversation: list[Any] | None = None
        if earlier is not None:
            head, n = earlier.head, earlier.messages
            # (a head ends where a message does, or with `,[`: messages delimit themselves)
            if n <= len(messages) and raw.startswith(head):
                conversation = earlier.conversation[:1 + n]
                conversation += [_unmarked_message(m) for m in messages[n:]]
                proven = n
        if conversation is None:
            conversation = self.conversation(payload)
        # all but the newest message, for the next turn: `,` and it, then `]]`, cut off
        cut = len(raw) - 2 - last - (len(messages) > 1)
        try:
            written_last = len(orjson.dumps(conversation[-1]))
        except (TypeError, ValueError):
            return Read(conversation, None, proven)
        # (the system prompt is among the payload's other values, checked apart: `others`)
        floatless = raw.find(b"e+", len(earlier.head) if proven and earlier else 0) < 0
        return Read(conversation, Raw(raw[:cut], len(messages) - 1, conversation, written_last),
                    proven, floatless)

    def continues(self, payload: dict[str, Any]) -> str | None:
        return None

    def placement_index(self, placement: Placement, conversation: list[Any]) -> int | None:
        if placement == "system":
            return None
        if placement == "last_message":
            t = _last_user(conversation[1:])
            return len(conversation) if t is None else t + 1
        return len(conversation)

    def place(
        self, payload: dict[str, Any], conversation: list[Any], placement: Placement, text: str,
        again: list[tuple[int, str]], previous: Disclosed | None = None, proven: int = 0,
    ) -> tuple[dict[str, Any], Disclosed | None]:
        if placement == "system":
            payload["system"] = _system_with(payload.get("system"), text)
            return payload, None
        items: list[Any] = payload["messages"]  # the client's, markers and all
        n = len(items)
        appends: dict[int, list[str]] = {}
        inserts: dict[int, list[str]] = {}
        moved = False  # a text placed on another item than its own, inserted, or left off

        def put(at: int, t: str) -> None:
            # A text placed before item `at` joins the user message there instead of
            # making two user messages in a row (which the API refuses).
            nonlocal moved
            moved = True
            if at - 1 >= 0 and _is_user(items[at - 1]):
                appends.setdefault(at - 1, []).append(t)
            elif at < n and _is_user(items[at]):
                appends.setdefault(at, []).append(t)
            else:
                inserts.setdefault(at, []).append(t)

        target = _last_user(items) if placement == "last_message" else None
        texts = sorted(again)
        # The previous turn's placed items stand for this turn's first `proven` ones (the same
        # bytes) when the texts that went on them, each on its own user item, are the texts
        # this turn puts there: only the texts after them are placed (a long episode re-applies
        # a text to every earlier turn's message).
        taken: list[Any] = []
        if previous is not None and target is not None and 0 < proven <= target and (
                proven <= len(previous.messages)):
            mine = bisect.bisect_left(texts, (proven + 1,))  # (item i is conversation i + 1)
            theirs = bisect.bisect_left(previous.texts, (proven + 1,))
            if texts[:mine] == previous.texts[:theirs]:
                taken, texts = previous.messages[:proven], texts[mine:]
        base = len(taken)
        for idx, old in texts:
            i = idx - 1  # conversation index -> message index
            if i == target:  # this turn's own place (a resend of it): its text is new
                moved = True
                continue
            if placement == "last_message" and 0 <= i < n and _is_user(items[i]):
                appends.setdefault(i, []).append(old)
            elif 0 <= i < n:
                put(i, old)
            else:
                moved = True
        if target is not None:
            appends.setdefault(target, []).append(text)
        else:
            put(n, text)
        if base and (moved or min(appends) < base):  # (an edit among the items taken)
            return self.place(payload, conversation, placement, text, again)
        placed = disclosure.edit(items, appends, inserts, _append, _new)
        placed[:base] = taken
        payload["messages"] = placed
        if moved or placement != "last_message" or target is None:
            return payload, None
        # every text on its own user item: the next turn may take these items as they are
        return payload, Disclosed(placed, sorted([*again, (target + 1, text)]), base)

    def kept_after(self, placed: Disclosed) -> tuple[int, list[Any]]:
        # (the system prompt, the same bytes as the previous turn's, and the items taken)
        return 1 + placed.base, [_unmarked_message(m) for m in placed.messages[placed.base:]]

    def read_body(self, data: bytes) -> Reply:
        try:
            return read_message(orjson.loads(data))
        except orjson.JSONDecodeError:
            return dict(EMPTY_REPLY)

    def read_parsed(self, obj: Any) -> Reply:
        return read_message(obj)

    def read_events(self, events: list[bytes]) -> Reply:
        blocks: dict[int, dict[str, Any]] = {}
        partial: dict[int, list[str]] = {}
        usage: dict[str, Any] = {}
        stop: Any = None
        for obj in json_objects(events):
            kind, index = obj.get("type"), obj.get("index")
            if kind == "message_start" and isinstance(obj.get("message"), dict):
                _merge_usage(usage, obj["message"].get("usage"))
            elif kind == "content_block_start" and isinstance(index, int):
                block = obj.get("content_block")
                blocks[index] = dict(block) if isinstance(block, dict) else {}
            elif kind == "content_block_delta" and index in blocks:
                delta = obj.get("delta")
                if not isinstance(delta, dict):
                    continue
                block = blocks[index]
                for key in ("text", "thinking", "signature"):
                    if isinstance(delta.get(key), str):
                        block[key] = block.get(key, "") + delta[key]
                if isinstance(delta.get("partial_json"), str):
                    partial.setdefault(index, []).append(delta["partial_json"])
            elif kind == "message_delta":
                delta = obj.get("delta")
                if isinstance(delta, dict) and delta.get("stop_reason") is not None:
                    stop = delta["stop_reason"]
                _merge_usage(usage, obj.get("usage"))
        for index, pieces in partial.items():
            try:
                blocks[index]["input"] = orjson.loads("".join(pieces) or "{}")
            except orjson.JSONDecodeError:  # a stream cut inside a tool's arguments
                blocks[index]["input"] = "".join(pieces)
        message = message_of([blocks[i] for i in sorted(blocks)])
        return {"message": message, "finish_reason": stop, "usage": usage or None}

    def ends_stream(self, event: bytes) -> bool:
        return event.find(b"message_stop", 0, 64) >= 0  # the `event:` line, or the data's "type"

    def synthetic(
        self, model: str, finish_reason: str, stream: bool, payload: dict[str, Any], text: str,
    ) -> tuple[bytes, bytes]:
        return messages_finish.reply(model, finish_reason, stream, text)

    def error_body(self, err: ProxyError) -> bytes:
        return err.anthropic_body()

    def upstream_key_header(self, api_key: str) -> tuple[str, str]:
        return "x-api-key", api_key

    def log_fields(self, conversation: list[Any], seen: int) -> dict[str, Any]:
        return head_log_fields(conversation, seen, "system")
