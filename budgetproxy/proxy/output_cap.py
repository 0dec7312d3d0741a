"""A request's output-token cap, per API: read it, and clamp it to what a budget leaves."""

from __future__ import annotations

from typing import Any

# The fields that cap a call's output tokens, by dialect kind; the first is the one set on a
# request that names none (OpenAI's current chat field; vLLM and SGLang read it too).
CAP_FIELDS: dict[str, tuple[str, ...]] = {
    "chat": ("max_completion_tokens", "max_tokens"),
    "completions": ("max_tokens",),
    "responses": ("max_output_tokens",),
    "messages": ("max_tokens",),
}


def client_cap(kind: str, payload: dict[str, Any]) -> int | None:
    """The smallest output cap the request sets (None: it sets none, or none that is a
    positive integer: the upstream judges those)."""
    cap = None
    for f in CAP_FIELDS.get(kind, ()):
        v = payload.get(f)
        if type(v) is int and v > 0 and (cap is None or v < cap):
            cap = v
    return cap


def with_cap(kind: str, payload: dict[str, Any], cap: int) -> dict[str, Any]:
    """The payload with every cap field it sets lowered to `cap` (the first field set when it
    sets none). Never raises a cap: `cap` comes from core.axes.plan, at most the client's."""
    fields = CAP_FIELDS.get(kind, ())
    present = [f for f in fields if f in payload]
    out = dict(payload)
    for f in present or fields[:1]:
        value = payload.get(f)
        out[f] = cap if type(value) is not int or value > cap else value
    return out
