"""The fake upstream's Responses and Messages answers, and the proxy's synthetic replies,
validate strictly against the official SDKs' own types (pydantic models of the wire format)."""

from __future__ import annotations

from typing import Any

import anthropic.types as at
import openai.types.responses as rt
import orjson
import pytest
from pydantic import TypeAdapter

from budgetproxy.proxy.dialects import DIALECTS
from budgetproxy.proxy.sse import EventSplitter, event_data
from budgetproxy.testing import fake_messages, fake_responses

RESPONSE_EVENT: TypeAdapter[Any] = TypeAdapter(rt.ResponseStreamEvent)
MESSAGE_EVENT: TypeAdapter[Any] = TypeAdapter(at.RawMessageStreamEvent)
REQ_TOOLS = [{"type": "function", "name": "look", "parameters": {
    "type": "object", "properties": {"where": {"type": "string"}}}}]
ANTHROPIC_TOOLS = [{"name": "look", "input_schema": {
    "type": "object", "properties": {"where": {"type": "string"}}}}]


def datas(raw: bytes) -> list[Any]:
    out = []
    for ev in EventSplitter().feed(raw):
        data = event_data(ev)
        assert data is not None
        out.append(orjson.loads(data))
    return out


def joined(events: Any) -> bytes:
    return b"".join(e for e in events if isinstance(e, bytes))


@pytest.mark.parametrize("tools", [None, REQ_TOOLS])
def test_fake_responses_validate_as_the_openai_types(tools: Any) -> None:
    req: dict[str, Any] = {"model": "m", "input": "hi there", **({"tools": tools} if tools else {})}
    output = fake_responses.answer(req, 2, False)
    for n, item in enumerate(output):
        item["id"] = f"item_{n}"
    body = fake_responses.response("resp_1", req, "m", output, "completed",
                                   fake_responses.usage_of(req, output))
    rt.Response.model_validate(body)
    events = datas(joined(fake_responses.events(body, 3, 0.0)))
    for e in events:
        RESPONSE_EVENT.validate_python(e)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    kinds = {e["type"] for e in events}
    assert ("response.function_call_arguments.done" in kinds) == bool(tools)
    assert ("response.output_text.delta" in kinds) == (not tools)


@pytest.mark.parametrize("tools", [None, ANTHROPIC_TOOLS])
def test_fake_messages_validate_as_the_anthropic_types(tools: Any) -> None:
    req: dict[str, Any] = {"model": "m", "max_tokens": 8,
                           "messages": [{"role": "user", "content": "hi there"}],
                           **({"tools": tools} if tools else {})}
    blocks, stop = fake_messages.answer(req, 1, False)
    body = fake_messages.message("msg_1", "m", blocks, stop,
                                 fake_messages.usage_of(req, blocks, 5, 2))
    at.Message.model_validate(body)
    events = datas(joined(fake_messages.events(body, 3, 0.0)))
    for e in events:
        if e["type"] != "ping":
            MESSAGE_EVENT.validate_python(e)
    assert events[0]["message"]["usage"]["cache_read_input_tokens"] == 5


@pytest.mark.parametrize("stream", [False, True])
def test_synthetic_replies_validate_as_the_sdk_types(stream: bool) -> None:
    _, data = DIALECTS["/v1/responses"].synthetic("m", "length", stream, {"input": "x"}, "done")
    if stream:
        for e in datas(data):
            RESPONSE_EVENT.validate_python(e)
    else:
        rt.Response.model_validate(orjson.loads(data))
    _, data = DIALECTS["/v1/messages"].synthetic("m", "length", stream, {}, "done")
    if stream:
        for e in datas(data):
            MESSAGE_EVENT.validate_python(e)
    else:
        at.Message.model_validate(orjson.loads(data))
