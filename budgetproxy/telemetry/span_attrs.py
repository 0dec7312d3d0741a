"""What a model call's span says: its GenAI-convention and budgetproxy attributes, by group."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from opentelemetry.trace import Status, StatusCode

from budgetproxy.config import UpstreamConfig
from budgetproxy.core.usage import token_counts

OPERATION = {"chat": "chat", "completions": "text_completion", "responses": "chat",
             "messages": "chat"}
UNSET = Status(StatusCode.UNSET)
ERROR = Status(StatusCode.ERROR)


def span_parts(
    kind: str, model: str | None, upstream: UpstreamConfig, episode_id: str | None,
    episode: tuple[int, str, str | None] | None, remaining: int | None,
    grant: tuple[int, int, bool] | None,
    status: int, error_class: str | None, usage: Any, finish_reason: Any,
    content: dict[str, Any] | None,
) -> tuple[str, tuple[Any, ...], tuple[Any, ...], tuple[Any, ...], dict[str, Any], Status]:
    """A finished call's span name, the keys of its three repeating attribute groups (fixed
    by upstream and model, fixed for an episode, the call's small values), its other
    attributes (tokens, content) and its status: the ReadableSpan path's parts. CallTrace.encode
    builds the same attributes from the same helpers; the tests compare the two byte for byte."""
    op = OPERATION.get(kind, kind)
    error_type = error_type_of(status, error_class)
    outcome_key = (status, remaining, grant, finish_reason_attr(finish_reason), error_type)
    extra = token_attrs(usage)
    if content:
        extra.update(content)
    return (f"{op} {model}", (op, model, upstream.name, upstream.kind, upstream.base_url),
            (episode_id, None) if episode is None else (episode_id, *episode), outcome_key,
            extra, UNSET if error_type is None else ERROR)


def error_type_of(status: int, error_class: str | None) -> str | None:
    """The span's error.type: the upstream failure's class, or a 5xx status; else None."""
    if error_class is None and status < 500:
        return None
    return error_class or str(status)


def finish_reason_attr(value: Any) -> str | None:
    return (value if type(value) is str else str(value)) if value else None


def upstream_attrs(op: str, model: str | None, upstream: str, kind: str,
                   base_url: str) -> dict[str, Any]:
    """A span's attributes fixed by the upstream and model (the first group)."""
    return {
        "gen_ai.operation.name": op,
        "gen_ai.provider.name": "openai" if kind == "openai" else "litellm",
        "gen_ai.request.model": model or "",
        **_server_attrs(base_url),
        "budgetproxy.proxy.upstream": upstream,
    }


def _server_attrs(base_url: str) -> dict[str, Any]:
    """server.address (the host) and server.port of an upstream base URL, per the conventions."""
    try:
        url = urlsplit(base_url)
        port = url.port or {"http": 80, "https": 443}.get(url.scheme)
    except ValueError:
        return {"server.address": base_url}
    out: dict[str, Any] = {"server.address": url.hostname or base_url}
    if port is not None:
        out["server.port"] = port
    return out


def episode_attrs(episode_id: str | None, budget: int | None = None,
                  disclosure: str | None = None, task_id: str | None = None) -> dict[str, Any]:
    """A span's attributes fixed for an episode (the second group)."""
    out: dict[str, Any] = {}
    if episode_id is not None:
        out["gen_ai.conversation.id"] = episode_id
    if budget is not None:
        out["budgetproxy.budget"] = budget
        out["budgetproxy.disclosure"] = disclosure
        if task_id:
            out["budgetproxy.task_id"] = task_id
    return out


def outcome_attrs(status: int, remaining: int | None,
                  grant: tuple[int, int, bool] | None, finish_reason: str | None,
                  error_type: str | None) -> dict[str, Any]:
    """A span's attributes from the call's small, repeating values (the third group)."""
    out: dict[str, Any] = {"http.response.status_code": status}
    if remaining is not None:
        out["budgetproxy.remaining"] = remaining
    if grant is not None:
        out["budgetproxy.turn"], out["budgetproxy.attempt"], out["budgetproxy.charged"] = grant
    if finish_reason:
        out["gen_ai.response.finish_reasons"] = (finish_reason,)
    if error_type is not None:
        out["error.type"] = error_type
    return out


def token_attrs(usage: Any) -> dict[str, Any]:
    """Token usage attributes from an OpenAI-style (or Responses/Messages) usage object."""
    out: dict[str, Any] = {}
    tin, tout = token_counts(usage)
    if tin is not None:
        out["gen_ai.usage.input_tokens"] = tin
    if tout is not None:
        out["gen_ai.usage.output_tokens"] = tout
    return out


def message_parts(message: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI-style message in the GenAI conventions' shape: role and typed parts."""
    role = message.get("role") or "user"
    parts: list[dict[str, Any]] = []
    content = message.get("content")
    if role == "tool":
        parts.append({"type": "tool_call_response", "id": message.get("tool_call_id"),
                      "response": content})
    elif isinstance(content, str):
        parts.append({"type": "text", "content": content})
    elif isinstance(content, list):
        for item in content:
            if isinstance(item, dict) and isinstance(item.get("text"), str):
                parts.append({"type": "text", "content": item["text"]})
            elif isinstance(item, dict):
                parts.append({"type": str(item.get("type", "unknown"))})
    for tc in message.get("tool_calls") or ():
        if isinstance(tc, dict):
            fn = tc.get("function")
            if not isinstance(fn, dict):
                fn = {}
            parts.append({"type": "tool_call", "id": tc.get("id"), "name": fn.get("name"),
                          "arguments": fn.get("arguments")})
    return {"role": role, "parts": parts}
