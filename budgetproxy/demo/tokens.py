"""Token counts of the simulated model: what a request and a reply cost, and what tokens buy.

The simulated model has no tokenizer; it counts as a BPE tokenizer roughly does on English and
JSON, four characters a token, plus the chat template's framing. The demo model server
reports these counts as usage, and the budget-aware policy uses the same counts to judge how
many calls a disclosed token budget still pays for.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from typing import Any

# Tokens a reply spends: per move call (its name, JSON arguments and call framing) and per reply.
CALL_TOKENS, REPLY_TOKENS = 15, 5


def message_text(message: Mapping[str, Any]) -> str:
    """The text of a chat message, whether content is a string or a list of parts."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(p.get("text", "")) for p in content if isinstance(p, Mapping) and "text" in p
        )
    return ""


def text_tokens(text: str) -> int:
    """Tokens of a text, as a BPE tokenizer counts English and JSON: about four characters each."""
    return math.ceil(len(text) / 4)


def prompt_tokens(messages: Iterable[Mapping[str, Any]], tools: Any = None) -> int:
    """Input tokens of a chat request: each message's text and tool calls, 4 tokens of chat
    framing per message, the tools' schema, and 3 tokens priming the reply."""
    total = 3 + (text_tokens(json.dumps(tools)) if tools else 0)
    for m in messages:
        total += 4 + text_tokens(message_text(m))
        if m.get("tool_calls"):
            total += text_tokens(json.dumps(m["tool_calls"]))
    return total


def reply_tokens(moves: int, text: str | None = None) -> int:
    """Output tokens of a reply of `moves` move calls (or of a closing text)."""
    return REPLY_TOKENS + (CALL_TOKENS * moves if moves else text_tokens(text or ""))


def turns_paid(tokens: int, prompt: int, growth: int) -> int:
    """Calls `tokens` pay for when this call's prompt is `prompt` tokens and each later call's
    is `growth` more (each call also writes a reply of about one move)."""
    calls, cost = 0, prompt + reply_tokens(1)
    while tokens >= cost and calls < 1000:
        tokens -= cost
        calls += 1
        cost += growth
    return calls
