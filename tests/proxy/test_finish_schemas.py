"""Every finish-mode body and event, as the real server sends it, against the API's own
definitions: the Responses API's OpenAPI schema (openai/openai-openapi, the part kept in
schemas/openai_responses.json) and the openai SDK's types; the anthropic SDK's types, strict.
A Response also echoes the request's settings as the API does."""

from __future__ import annotations

import functools
import itertools
import json
from pathlib import Path
from typing import Any

import anthropic
import httpx
import jsonschema
import openai
import pydantic
import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response, ResponseStreamEvent

from budgetproxy.proxy.sse import EventSplitter, event_data
from tests.conftest import Proxy, ProxyFactory, new_id

SCHEMAS = Path(__file__).parent / "schemas" / "openai_responses.json"
CALLS = itertools.count()


@functools.cache
def openapi() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(SCHEMAS.read_text(encoding="utf-8"))
    return doc


@functools.cache
def event_schemas() -> dict[str, str]:
    """Each stream event type's own schema (the union's members), for errors that name it."""
    schemas = openapi()["components"]["schemas"]
    out = {}
    for member in schemas["ResponseStreamEvent"]["anyOf"]:
        name = member["$ref"].rsplit("/", 1)[1]
        for kind in schemas[name]["properties"]["type"].get("enum", []):
            out[kind] = name
    return out


def check_openapi(obj: dict[str, Any], name: str) -> None:
    validator = jsonschema.Draft202012Validator(
        {"$ref": f"#/components/schemas/{name}", **openapi()})
    errors = [f"{list(e.absolute_path)}: {e.message[:200]}" for e in validator.iter_errors(obj)]
    assert not errors, (name, errors)


@pytest.fixture(scope="module")
def finishing(proxy: ProxyFactory) -> Proxy:
    return proxy({"budget": {"on_exhausted": "finish", "finish_replies": None}})


def exhausted(p: Proxy) -> str:
    eid = new_id()
    r = p.http().post("/v1/chat/completions", headers={"X-Episode-Id": eid,
                      "X-Episode-Budget": "1"},
                      json={"model": "m1", "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 200
    return eid


def final(p: Proxy, eid: str, route: str, body: dict[str, Any]) -> httpx.Response:
    """The finish-mode answer on `route` (each body new: a resend would be a retry)."""
    r = p.http().post(route, headers={"X-Episode-Id": eid, "x-api-key": "k"},
                      json=body)
    assert r.status_code == 200 and r.headers["x-episode-exhausted"] == "true", r.text
    return r


def events(r: httpx.Response) -> list[dict[str, Any]]:
    assert r.headers["content-type"].startswith("text/event-stream")
    splitter = EventSplitter()
    out = []
    for ev in splitter.feed(r.content):
        data = event_data(ev)
        if data is not None and data != b"[DONE]":
            out.append(json.loads(data))
    assert not splitter.rest().strip()
    return out


FUNCTION = {"type": "function", "name": "look", "description": "look around",
            "parameters": {"type": "object", "properties": {"where": {"type": "string"}}}}
SETTINGS: list[dict[str, Any]] = [
    {},
    {"tools": [FUNCTION], "user": "user-7", "metadata": {"run": "r1"},
     "text": {"format": {"type": "json_object"}}, "reasoning": {"effort": "low"},
     "truncation": "auto", "instructions": "Be brief.", "temperature": 0.2, "top_p": 0.9,
     "max_output_tokens": 64, "store": False, "parallel_tool_calls": False},
    {"tools": [{**FUNCTION, "strict": False}], "tool_choice": "required",
     "text": {"format": {"type": "json_schema", "name": "out", "strict": True,
                         "schema": {"type": "object", "properties": {},
                                    "additionalProperties": False}}},
     "reasoning": {"effort": "high", "summary": "auto"}},
]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("settings", SETTINGS)
def test_responses_final_reply_matches_the_openapi_schema_and_echoes_the_request(
        finishing: Proxy, settings: dict[str, Any], stream: bool) -> None:
    """`user: null`, tools without `strict`, and text.format, metadata, reasoning.effort,
    truncation and user replaced by defaults: the Response did not match the API's schema."""
    eid = exhausted(finishing)
    body = {"model": "m1", "input": f"go on {next(CALLS)}", "stream": stream, **settings}
    r = final(finishing, eid, "/v1/responses", body)
    if stream:
        evs = events(r)
        for ev in evs:
            check_openapi(ev, event_schemas()[ev["type"]])
            pydantic.TypeAdapter(ResponseStreamEvent).validate_python(ev, strict=True)
        assert [ev["sequence_number"] for ev in evs] == list(range(len(evs)))
        resp = evs[-1]["response"]
        assert evs[-1]["type"] == "response.completed"
    else:
        resp = r.json()
    check_openapi(resp, "Response")
    Response.model_validate(resp, strict=True)
    assert resp["status"] == "completed" and resp["output"][0]["role"] == "assistant"
    if "user" in settings:
        assert resp["user"] == settings["user"]
    else:
        assert "user" not in resp
    assert resp["metadata"] == settings.get("metadata", {})
    assert resp["text"]["format"] == settings.get("text", {}).get("format", {"type": "text"})
    assert resp["reasoning"]["effort"] == settings.get("reasoning", {}).get("effort")
    assert resp["truncation"] == settings.get("truncation", "disabled")
    for key in ("instructions", "temperature", "top_p", "max_output_tokens", "store",
                "parallel_tool_calls", "tool_choice"):
        if key in settings:
            assert resp[key] == settings[key], key
    sent = settings.get("tools", [])
    assert [t["strict"] for t in resp["tools"]] == [t.get("strict", True) for t in sent]
    assert [{k: t[k] for k in FUNCTION} for t in resp["tools"]] == [
        {k: t[k] for k in FUNCTION} for t in sent]


def test_the_openai_client_reads_the_echoed_settings(finishing: Proxy) -> None:
    eid = exhausted(finishing)
    client = finishing.client(default_headers={"X-Episode-Id": eid})
    resp = client.responses.create(model="m1", input="again", user="user-9",
                                   metadata={"k": "v"}, truncation="auto",
                                   reasoning={"effort": "medium"}, tools=[FUNCTION])  # type: ignore[list-item]
    assert (resp.user, resp.metadata, resp.truncation) == ("user-9", {"k": "v"}, "auto")
    assert resp.reasoning is not None and resp.reasoning.effort == "medium"
    assert resp.tools[0].type == "function" and resp.tools[0].strict is True


@pytest.mark.parametrize("stream", [False, True])
def test_messages_final_reply_matches_the_anthropic_types_strictly(
        finishing: Proxy, stream: bool) -> None:
    eid = exhausted(finishing)
    body = {"model": "m1", "max_tokens": 50, "stream": stream,
            "messages": [{"role": "user", "content": f"go on {next(CALLS)}"}]}
    r = final(finishing, eid, "/v1/messages", body)
    if not stream:
        anthropic.types.Message.model_validate(r.json(), strict=True)
        return
    evs = events(r)
    adapter = pydantic.TypeAdapter(anthropic.types.RawMessageStreamEvent)
    for ev in evs:
        adapter.validate_python(ev, strict=True)
    assert [ev["type"] for ev in evs][0] == "message_start"
    assert [ev["type"] for ev in evs][-1] == "message_stop"


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions"])
def test_chat_and_completions_final_replies_match_the_openai_types_strictly(
        finishing: Proxy, route: str, stream: bool) -> None:
    eid = exhausted(finishing)
    said = f"go on {next(CALLS)}"
    body: dict[str, Any] = {"model": "m1", "stream": stream}
    if route == "/v1/chat/completions":
        body["messages"] = [{"role": "user", "content": said}]
        if stream:
            body["stream_options"] = {"include_usage": True}
    else:
        body["prompt"] = said
    r = final(finishing, eid, route, body)
    whole, chunk = (ChatCompletion, ChatCompletionChunk) if "chat" in route else (
        Completion, Completion)
    if not stream:
        whole.model_validate(r.json(), strict=True)
        return
    assert r.content.endswith(b"data: [DONE]\n\n")
    evs = events(r)
    assert evs[-1 if chunk is Completion else -2]["choices"][0]["finish_reason"] == "length"
    for ev in evs:
        if chunk is Completion and ev["choices"][0]["finish_reason"] is None:
            # The SDK reads stream chunks into Completion, whose finish_reason has no null,
            # without validating; the API streams null until the last chunk, as sent here.
            ev = {**ev, "choices": [{**ev["choices"][0], "finish_reason": "length"}]}
        chunk.model_validate(ev, strict=True)


def test_a_tool_with_strict_false_stays_false_through_the_sdk(finishing: Proxy) -> None:
    eid = exhausted(finishing)
    client: openai.OpenAI = finishing.client(default_headers={"X-Episode-Id": eid})
    resp = client.responses.create(model="m1", input="again",
                                   tools=[{**FUNCTION, "strict": False}])  # type: ignore[list-item]
    assert resp.tools[0].type == "function" and resp.tools[0].strict is False
