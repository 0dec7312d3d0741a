"""Text completions (/v1/completions): the conversation is one user message, the prompt."""

from __future__ import annotations

from typing import Any

from budgetproxy.core.disclosure import Placement
from budgetproxy.errors import ProxyError, invalid_request
from budgetproxy.proxy import synthetic
from budgetproxy.proxy.dialects.base import Reply
from budgetproxy.proxy.dialects.chat import read_choice_body
from budgetproxy.proxy.sse import assemble, event_data


class CompletionsDialect:
    kind = "completions"
    heads = 0
    via_litellm = False
    discloses = False  # see place()
    stream_usage = True

    def validate(self, payload: dict[str, Any]) -> None:
        if "prompt" not in payload:
            raise invalid_request("'prompt' is required", "prompt")

    def conversation(self, payload: dict[str, Any]) -> list[Any]:
        return [{"role": "user", "content": payload.get("prompt")}]

    def continues(self, payload: dict[str, Any]) -> str | None:
        return None

    def placement_index(self, placement: Placement, conversation: list[Any]) -> int | None:
        return None  # a prompt is sent whole each time: nothing earlier to re-apply

    def place(
        self, payload: dict[str, Any], conversation: list[Any], placement: Placement, text: str,
        again: list[tuple[int, str]],
    ) -> dict[str, Any]:
        # A prompt is raw text the model continues: a disclosure in it would be continued as
        # if the client had written it, so completions are forwarded as sent.
        return payload

    def read_body(self, data: bytes) -> Reply:
        return read_choice_body(data, "text")

    def read_events(self, events: list[bytes]) -> Reply:
        return assemble(events)

    def ends_stream(self, event: bytes) -> bool:
        return event_data(event) == b"[DONE]"

    def synthetic(
        self, model: str, finish_reason: str, stream: bool, payload: dict[str, Any]
    ) -> tuple[bytes, bytes]:
        return synthetic.reply("completions", model, finish_reason, stream,
                               payload.get("stream_options"))

    def error_body(self, err: ProxyError) -> bytes:
        return err.body()

    def upstream_key_header(self, api_key: str) -> tuple[str, str]:
        return "authorization", f"Bearer {api_key}"

    def log_fields(self, conversation: list[Any], seen: int) -> dict[str, Any]:
        return {"request_messages": conversation[seen:], "messages_offset": seen}
