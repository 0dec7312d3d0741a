"""Token counts read from an upstream usage object, whatever API named them."""

from __future__ import annotations

from typing import Any


def token_counts(usage: Any) -> tuple[int | None, int | None]:
    """Input and output tokens of a usage object (Chat/Completions names, or Responses and
    Messages ones, where input includes the cache reads and writes Anthropic reports apart);
    None where it gives no whole number."""
    if not isinstance(usage, dict):
        return None, None
    tin = usage.get("prompt_tokens", usage.get("input_tokens"))
    tout = usage.get("completion_tokens", usage.get("output_tokens"))
    if isinstance(tin, int):  # Anthropic counts cached input apart from input_tokens
        for key in ("cache_creation_input_tokens", "cache_read_input_tokens"):
            extra = usage.get(key)
            if isinstance(extra, int):
                tin += extra
    return (tin if isinstance(tin, int) else None), (tout if isinstance(tout, int) else None)
