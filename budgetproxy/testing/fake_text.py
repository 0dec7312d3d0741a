"""Small text helpers the fake upstream's answers share: texts of parts, words, splits."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson


def text_of(content: Any) -> str:
    """The text of a message's content: a string, or the text parts of a list of parts (a
    tool result's own content list included)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for p in content:
            if not isinstance(p, dict):
                continue
            if "text" in p:
                out.append(str(p.get("text", "")))
            elif p.get("type") == "tool_result":
                out.append(text_of(p.get("content")))
        return "".join(out)
    return ""


def words(text: str) -> int:
    return len(text.split())


def split(text: str, n: int) -> Iterator[str]:
    """Exactly ``n`` pieces (some may be empty) that concatenate to ``text``."""
    size, extra = divmod(len(text), n)
    start = 0
    for i in range(n):
        end = start + size + (1 if i < extra else 0)
        yield text[start:end]
        start = end


def dummy_arguments(tool: Any) -> str:
    """Small deterministic JSON arguments that fit the tool's declared parameters (a chat
    tool, {"function": {"parameters": ...}})."""
    fn = tool.get("function", {}) if isinstance(tool, dict) else {}
    params = fn.get("parameters") if isinstance(fn, dict) else None
    if not isinstance(params, dict) and isinstance(fn, dict):
        params = fn.get("input_schema")  # an Anthropic tool
    props = params.get("properties") if isinstance(params, dict) else None
    if not isinstance(props, dict):
        return "{}"
    values: dict[Any, Any] = {
        "string": "fake",
        "integer": 1,
        "number": 1,
        "boolean": True,
        "array": [],
        "object": {},
    }
    args = {
        name: values.get(spec.get("type") if isinstance(spec, dict) else None)
        for name, spec in props.items()
    }
    return orjson.dumps(args).decode()
