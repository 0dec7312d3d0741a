"""A request's output-token cap, per API: read it, and clamp it to what a budget leaves."""

from __future__ import annotations

import math
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


# The fields that ask one request for several completions, by dialect kind: the upstream may
# write up to the output cap for each (`n`; `best_of` samples that many and returns `n`).
COUNT_FIELDS: dict[str, tuple[str, str]] = {
    "chat": ("n", "best_of"),
    "completions": ("n", "best_of"),
}


def completions(kind: str, payload: dict[str, Any]) -> int:
    """How many completions the request can have the upstream write: its largest count
    field, times its prompts on the completions API (a list of texts or of token lists).
    Read as leniently as an upstream might (2.0 or "2" as 2), so a budget holds for all."""
    fields = COUNT_FIELDS.get(kind)
    if fields is None:
        return 1
    many, best = payload.get(fields[0]), payload.get(fields[1])
    k = 1 if many is None and best is None else max(_count(many), _count(best))
    if kind == "completions":
        prompt = payload.get("prompt")
        if type(prompt) is list and len(prompt) > 1 and not isinstance(prompt[0], int):
            k *= len(prompt)
    return k


def _count(value: Any) -> int:
    """A count field's value as an upstream might read it, at least 1."""
    if type(value) is str:
        try:
            value = float(value.strip())
        except ValueError:
            return 1
    if type(value) is int:
        return value if value > 1 else 1
    if type(value) is float and value > 1:
        return math.ceil(value) if math.isfinite(value) else 1 << 63
    return 1


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
