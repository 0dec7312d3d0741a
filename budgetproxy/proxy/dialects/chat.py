"""Chat completions (/v1/chat/completions): the conversation is `messages`."""

from __future__ import annotations

from typing import Any

import orjson

from budgetproxy.core import disclosure
from budgetproxy.core.disclosure import Disclosed, Placement
from budgetproxy.core.prefixes import Raw
from budgetproxy.errors import ProxyError, invalid_request
from budgetproxy.proxy import synthetic
from budgetproxy.proxy.dialects.base import EMPTY_REPLY, Read, Reply, read_whole
from budgetproxy.proxy.sse import assemble, event_data


def check_messages(payload: dict[str, Any]) -> None:
    """`messages` is a non-empty list of objects with a string role (chat and messages)."""
    messages = payload.get("messages")
    if not isinstance(messages, list) or not messages:
        raise invalid_request("'messages' is required and must be a non-empty array", "messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise invalid_request(
                f"messages[{i}] must be an object with a string 'role'", f"messages[{i}]")


def read_choice_body(data: bytes, text_key: str | None) -> Reply:
    """The first choice of a chat (`text_key` None) or text completion body."""
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        return dict(EMPTY_REPLY)
    return read_choice_obj(obj, text_key)


def read_choice_obj(obj: Any, text_key: str | None) -> Reply:
    """`read_choice_body` of a body already parsed."""
    if not isinstance(obj, dict):
        return dict(EMPTY_REPLY)
    choices = obj.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        c0 = choices[0]
        message = (c0.get("message") if text_key is None
                   else {"role": "assistant", "content": c0.get(text_key)})
        return {"message": message, "finish_reason": c0.get("finish_reason"),
                "usage": obj.get("usage")}
    if "error" in obj:
        return {**EMPTY_REPLY, "error": obj["error"]}
    return {**EMPTY_REPLY, "usage": obj.get("usage")}


class ChoicesDialect:
    """What OpenAI's two choice-shaped APIs (chat and text completions) share: replies read
    from `choices`, `[DONE]` ending a stream, errors and keys as OpenAI has them."""

    kind = "chat"
    text_key: str | None = None  # where a choice keeps its text; None: in `message`
    heads = 0
    items_key: str | None = "messages"
    stream_usage = True

    def continues(self, payload: dict[str, Any]) -> str | None:
        return None

    def kept_after(self, placed: Disclosed) -> tuple[int, list[Any]]:
        return placed.base, placed.messages[placed.base:]  # (the upstream's list itself)

    def read_body(self, data: bytes) -> Reply:
        return read_choice_body(data, self.text_key)

    def read_parsed(self, obj: Any) -> Reply:
        """`read_body` of a body already parsed (a captured answer: parsed once for the reply
        and its tokens)."""
        return read_choice_obj(obj, self.text_key)

    def read_events(self, events: list[bytes]) -> Reply:
        return assemble(events)

    def ends_stream(self, event: bytes) -> bool:
        return event_data(event) == b"[DONE]"

    def synthetic(
        self, model: str, finish_reason: str, stream: bool, payload: dict[str, Any], text: str,
    ) -> tuple[bytes, bytes]:
        return synthetic.reply(self.kind, model, finish_reason, stream,
                               payload.get("stream_options"), text)

    def error_body(self, err: ProxyError) -> bytes:
        return err.body()

    def upstream_key_header(self, api_key: str) -> tuple[str, str]:
        return "authorization", f"Bearer {api_key}"

    def log_fields(self, conversation: list[Any], seen: int) -> dict[str, Any]:
        return {"request_messages": conversation[seen:], "messages_offset": seen}


class ChatDialect(ChoicesDialect):
    via_litellm = True
    discloses = True

    def validate(self, payload: dict[str, Any]) -> None:
        check_messages(payload)

    def conversation(self, payload: dict[str, Any]) -> list[Any]:
        msgs: list[Any] = payload["messages"]
        return msgs

    def conversation_from(self, payload: dict[str, Any], earlier: Raw | None) -> Read:
        return read_whole(payload["messages"])  # (the payload's own list)

    def placement_index(self, placement: Placement, conversation: list[Any]) -> int | None:
        return disclosure.placement_index(placement, len(conversation))

    def place(
        self, payload: dict[str, Any], conversation: list[Any], placement: Placement, text: str,
        again: list[tuple[int, str]], previous: Disclosed | None = None, proven: int = 0,
    ) -> tuple[dict[str, Any], Disclosed | None]:
        if placement == "last_message":
            payload["messages"], placed = disclosure.placed_last(conversation, text, again,
                                                                 previous)
            return payload, placed
        payload["messages"] = disclosure.apply(conversation, placement, text, again)
        return payload, None
