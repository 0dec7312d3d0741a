"""Text completions (/v1/completions): the conversation is one user message, the prompt."""

from __future__ import annotations

from typing import Any

from budgetproxy.core.disclosure import Disclosed, Placement
from budgetproxy.core.prefixes import Raw
from budgetproxy.errors import invalid_request
from budgetproxy.proxy.dialects.base import Read, read_whole
from budgetproxy.proxy.dialects.chat import ChoicesDialect


class CompletionsDialect(ChoicesDialect):
    kind = "completions"
    items_key: str | None = None  # (its conversation is the prompt)
    text_key = "text"
    via_litellm = False
    discloses = False  # see place()

    def validate(self, payload: dict[str, Any]) -> None:
        if "prompt" not in payload:
            raise invalid_request("'prompt' is required", "prompt")

    def conversation(self, payload: dict[str, Any]) -> list[Any]:
        return [{"role": "user", "content": payload.get("prompt")}]

    def conversation_from(self, payload: dict[str, Any], earlier: Raw | None) -> Read:
        return read_whole(self.conversation(payload))

    def placement_index(self, placement: Placement, conversation: list[Any]) -> int | None:
        return None  # a prompt is sent whole each time: nothing earlier to re-apply

    def place(
        self, payload: dict[str, Any], conversation: list[Any], placement: Placement, text: str,
        again: list[tuple[int, str]], previous: Disclosed | None = None, proven: int = 0,
    ) -> tuple[dict[str, Any], Disclosed | None]:
        # A prompt is raw text the model continues: a disclosure in it would be continued as
        # if the client had written it, so completions are forwarded as sent.
        return payload, None
