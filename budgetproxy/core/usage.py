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


def _int(v: Any) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) else 0


def billed_tokens(usage: Any) -> tuple[int, int, int, int] | None:
    """(input, output, cache read, cache write) of a usage object, input counting cached
    tokens on every API: OpenAI's prompt/input tokens include them already, Anthropic's
    `input_tokens` leaves out its cache reads and writes, which token_counts adds.
    None: no counts."""
    tin, tout = token_counts(usage)
    if tin is None and tout is None:
        return None
    assert isinstance(usage, dict)
    details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details")
    read = _int(details.get("cached_tokens")) if isinstance(details, dict) else 0
    write = 0
    if "cache_read_input_tokens" in usage or "cache_creation_input_tokens" in usage:
        read = _int(usage.get("cache_read_input_tokens"))
        write = _int(usage.get("cache_creation_input_tokens"))
    return tin or 0, tout or 0, read, write
