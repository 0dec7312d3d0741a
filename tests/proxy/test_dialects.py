"""Each dialect's placements, read-back and synthetic replies, without sockets."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from budgetproxy.core.disclosure import Placement
from budgetproxy.errors import ProxyError
from budgetproxy.proxy.dialects import DIALECTS
from budgetproxy.proxy.sse import EventSplitter
from budgetproxy.testing import fake_messages, fake_responses

RESPONSES = DIALECTS["/v1/responses"]
MESSAGES = DIALECTS["/v1/messages"]
T = "[budget]"
EXHAUSTED_TEXT = "[Turn budget exhausted] This episode has no turns left."


def place(dialect: Any, payload: dict[str, Any], placement: Placement,
          again: list[tuple[int, str]] | None = None) -> dict[str, Any]:
    conv = dialect.conversation(payload)
    return dict(dialect.place(dict(payload), conv, placement, T, again or [])[0])


# -- Responses ---------------------------------------------------------------------------------

def test_responses_string_input_gets_the_text_appended() -> None:
    out = place(RESPONSES, {"model": "m", "input": "do it"}, "last_message")
    assert out["input"] == "do it\n\n" + T


def test_responses_last_message_joins_the_last_message_item_as_an_input_text_part() -> None:
    parts = [{"type": "input_text", "text": "a"}, {"type": "input_image", "image_url": "u"}]
    items = [{"role": "user", "content": parts}]
    out = place(RESPONSES, {"model": "m", "input": items}, "last_message")
    assert out["input"][0]["content"] == [*parts, {"type": "input_text", "text": T}]
    assert items[0]["content"] == parts  # the client's intact
    # One text part takes the text into its own, as a string content would.
    one = [{"role": "user", "content": [{"type": "input_text", "text": "a"}]}]
    out = place(RESPONSES, {"model": "m", "input": one}, "last_message")
    assert out["input"][0]["content"] == [{"type": "input_text", "text": "a\n\n" + T}]


def test_responses_after_a_function_call_output_the_text_joins_the_output() -> None:
    items = [{"role": "user", "content": "go"},
             {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
             {"type": "function_call_output", "call_id": "c", "output": "42"}]
    out = place(RESPONSES, {"model": "m", "input": items}, "last_message")
    assert out["input"][:2] == items[:2]
    assert out["input"][2]["output"] == "42\n\n" + T


def test_responses_system_appends_to_instructions_and_new_message_adds_a_user_item() -> None:
    out = place(RESPONSES, {"model": "m", "input": "x", "instructions": "be brief"}, "system")
    assert out["instructions"] == "be brief\n\n" + T and out["input"] == "x"
    assert place(RESPONSES, {"model": "m", "input": "x"}, "system")["instructions"] == T
    items = [{"role": "user", "content": "x"}]
    out = place(RESPONSES, {"model": "m", "input": items}, "new_message")
    assert out["input"] == [*items, {"role": "user", "content": T}]


def test_responses_history_keep_reapplies_earlier_texts_by_item() -> None:
    items = [{"role": "user", "content": "one"},
             {"type": "message", "role": "assistant",
              "content": [{"type": "output_text", "text": "r"}]},
             {"role": "user", "content": "two"}]
    conv = RESPONSES.conversation({"input": items})
    assert RESPONSES.placement_index("last_message", conv) == 3  # item 2, after the head
    out = place(RESPONSES, {"model": "m", "input": items}, "last_message", [(1, "[old]")])
    assert [i.get("content") for i in out["input"]][::2] == ["one\n\n[old]", "two\n\n" + T]


def test_responses_conversation_heads_with_the_instructions_and_logs_them_once() -> None:
    conv = RESPONSES.conversation({"input": "x", "instructions": "sys"})
    assert RESPONSES.log_fields(conv, 0) == {
        "request_messages": [{"role": "user", "content": "x"}], "messages_offset": 0,
        "instructions": "sys"}
    longer = RESPONSES.conversation({"input": [{"role": "user", "content": "x"},
                                               {"role": "user", "content": "y"}]})
    assert RESPONSES.log_fields(longer, 2) == {
        "request_messages": [{"role": "user", "content": "y"}], "messages_offset": 1}


def _events(raw: bytes) -> list[bytes]:
    return EventSplitter().feed(raw)


def test_responses_reply_read_from_a_body_and_from_the_full_event_stream() -> None:
    req = {"input": "hi", "tools": [{"type": "function", "name": "look", "parameters": {}}]}
    output = fake_responses.answer(req, 2, False)
    for n, item in enumerate(output):
        item["id"] = f"fc_{n}"
    body = fake_responses.response("resp_1", req, "m", output, "completed",
                                   fake_responses.usage_of(req, output))
    whole = RESPONSES.read_body(orjson.dumps(body))
    streamed = RESPONSES.read_events(_events(b"".join(
        e for e in fake_responses.events(body, 3, 0.0) if isinstance(e, bytes))))
    for reply in (whole, streamed):
        assert reply["finish_reason"] == "completed"
        assert reply["usage"]["total_tokens"] == body["usage"]["total_tokens"]
        assert [c["function"]["name"] for c in reply["message"]["tool_calls"]] == ["look"] * 2
        assert reply["message"]["tool_calls"][0]["id"] == "call_0"


@pytest.mark.parametrize("stream", [False, True])
def test_responses_synthetic_reply_is_a_completed_response(stream: bool) -> None:
    ctype, data = RESPONSES.synthetic("m", "length", stream, {"input": "x"}, EXHAUSTED_TEXT)
    reply = (RESPONSES.read_events(_events(data)) if stream
             else RESPONSES.read_body(data))
    assert reply["message"]["content"] == EXHAUSTED_TEXT and "tool_calls" not in reply["message"]
    assert reply["finish_reason"] == "completed"
    if stream:
        seq = [orjson.loads(e.split(b"data: ", 1)[1]) for e in _events(data)]
        assert [e["sequence_number"] for e in seq] == list(range(len(seq)))
        assert [e["type"] for e in seq][:3] == ["response.created", "response.in_progress",
                                                "response.output_item.added"]
        assert ctype == b"text/event-stream"


# -- Messages ----------------------------------------------------------------------------------

def test_messages_last_message_adds_a_block_after_tool_results() -> None:
    msgs = [{"role": "user", "content": "go"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f",
                                               "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                                          "content": "ok", "cache_control": {"type":
                                                                             "ephemeral"}}]}]
    out = place(MESSAGES, {"model": "m", "messages": msgs}, "last_message")
    assert out["messages"][2]["content"] == [*msgs[2]["content"], {"type": "text", "text": T}]


def test_messages_last_message_skips_a_trailing_system_message() -> None:
    msgs = [{"role": "user", "content": "go"}, {"role": "system", "content": "note"}]
    out = place(MESSAGES, {"model": "m", "messages": msgs}, "last_message")
    assert out["messages"][0]["content"] == [{"type": "text", "text": "go"},
                                             {"type": "text", "text": T}]
    assert out["messages"][1] == msgs[1]


def test_messages_new_message_never_makes_two_user_messages_in_a_row() -> None:
    msgs = [{"role": "user", "content": [{"type": "text", "text": "go"}]}]
    out = place(MESSAGES, {"model": "m", "messages": msgs}, "new_message")
    assert len(out["messages"]) == 1
    assert out["messages"][0]["content"][-1] == {"type": "text", "text": T}


@pytest.mark.parametrize(("system", "expected"), [
    (None, T), ("be brief", "be brief\n\n" + T),
    ([{"type": "text", "text": "a"}], [{"type": "text", "text": "a"}, {"type": "text", "text": T}]),
])
def test_messages_system_appends_to_the_top_level_system(system: Any, expected: Any) -> None:
    payload: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    if system is not None:
        payload["system"] = system
    assert place(MESSAGES, payload, "system")["system"] == expected


def test_messages_conversation_ignores_cache_control_markers() -> None:
    a = [{"role": "user", "content": [{"type": "text", "text": "x",
                                       "cache_control": {"type": "ephemeral"}}]}]
    b = [{"role": "user", "content": [{"type": "text", "text": "x"}]}]
    assert MESSAGES.conversation({"messages": a}) == MESSAGES.conversation({"messages": b})
    assert MESSAGES.conversation({"messages": b})[1] is b[0]  # unmarked: the client's object


def test_messages_reply_read_from_the_stream_keeps_cache_tokens_and_tool_use() -> None:
    req = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5,
           "tools": [{"name": "look", "input_schema": {"type": "object", "properties": {
               "where": {"type": "string"}}}}]}
    blocks, stop = fake_messages.answer(req, 1, False)
    body = fake_messages.message("msg_1", "m", blocks, stop,
                                 fake_messages.usage_of(req, blocks, 7, 3))
    streamed = MESSAGES.read_events(_events(b"".join(
        e for e in fake_messages.events(body, 3, 0.0) if isinstance(e, bytes))))
    whole = MESSAGES.read_body(orjson.dumps(body))
    for reply in (whole, streamed):
        assert reply["finish_reason"] == "tool_use"
        assert reply["usage"]["cache_read_input_tokens"] == 7
        assert reply["usage"]["cache_creation_input_tokens"] == 3
        assert reply["usage"]["output_tokens"] == body["usage"]["output_tokens"]
        call = reply["message"]["tool_calls"][0]
        assert (call["id"], call["function"]["name"]) == ("toolu_0", "look")
        assert orjson.loads(call["function"]["arguments"]) == {"where": "fake"}


def test_messages_errors_are_anthropic_shaped() -> None:
    body = orjson.loads(MESSAGES.error_body(ProxyError(413, "request_too_large", "big")))
    assert body == {"type": "error", "error": {"type": "request_too_large",
                                               "message": "big (request_too_large)"}}


def test_messages_new_message_replays_merge_into_the_user_message_they_followed() -> None:
    first = [{"role": "user", "content": "task"}]
    conv = MESSAGES.conversation({"messages": first})
    index = MESSAGES.placement_index("new_message", conv)
    assert index == 2  # after message 0, in conversation units (the system head is 0)
    later = [*first, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "more"}]
    out = place(MESSAGES, {"model": "m", "messages": later}, "new_message", [(index, "[old]")])
    assert [m["role"] for m in out["messages"]] == ["user", "assistant", "user"]
    assert out["messages"][0]["content"][-1] == {"type": "text", "text": "[old]"}
    assert out["messages"][2]["content"][-1] == {"type": "text", "text": T}


def test_responses_new_message_replays_go_after_tool_outputs() -> None:
    items = [{"role": "user", "content": "go"},
             {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
             {"type": "function_call_output", "call_id": "c", "output": "1"},
             {"role": "user", "content": "next"}]
    out = place(RESPONSES, {"model": "m", "input": items}, "new_message", [(3, "[old]")])
    assert [i.get("type", i.get("role")) for i in out["input"]] == [
        "user", "function_call", "function_call_output", "user", "user", "user"]
    assert out["input"][3] == {"role": "user", "content": "[old]"}
    assert out["input"][-1] == {"role": "user", "content": T}


@pytest.mark.parametrize(("dialect", "payload"), [
    (RESPONSES, {"model": "m", "input": [{"role": "user", "content": "x"}]}),
    (MESSAGES, {"model": "m", "messages": [{"role": "user", "content": "x"}]}),
])
def test_a_resent_turn_gets_its_text_once(dialect: Any, payload: dict[str, Any]) -> None:
    """A retry of a turn carries that turn's own earlier placement: not re-applied there."""
    conv = dialect.conversation(payload)
    index = dialect.placement_index("last_message", conv)
    out = place(dialect, payload, "last_message", [(index, T)])
    assert str(out).count(T) == 1


def _markers_dropped(value: Any) -> Any:
    """The rule, written plainly: every `cache_control` key gone from dicts at any depth
    reached through lists and message/block `content`."""
    if isinstance(value, list):
        return [_markers_dropped(v) for v in value]
    if not isinstance(value, dict):
        return value
    out = {k: v for k, v in value.items() if k != "cache_control"}
    if isinstance(value.get("content"), list):
        out["content"] = _markers_dropped(value["content"])
    return out


_leaf = st.one_of(st.text(max_size=3), st.integers(), st.none())
_marker = st.just({"type": "ephemeral"})
_block = st.fixed_dictionaries(
    {"type": st.sampled_from(["text", "tool_result", "tool_use"])},
    optional={"text": st.text(max_size=3), "cache_control": _marker,
              "content": st.one_of(st.text(max_size=3),
                                   st.lists(st.fixed_dictionaries(
                                       {"type": st.just("text")},
                                       optional={"cache_control": _marker,
                                                 "text": st.text(max_size=3)}), max_size=3)),
              "input": st.dictionaries(st.text(max_size=2), _leaf, max_size=2)})
_message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant"]),
     # (a list inside the content list: not the API's shape, but read as sent)
     "content": st.one_of(st.text(max_size=3),
                          st.lists(_block | st.lists(_block, max_size=2), max_size=3))},
    optional={"cache_control": _marker})


@given(messages=st.lists(_message, max_size=5),
       system=st.one_of(st.none(), st.text(max_size=3), st.lists(_block, max_size=2)))
def test_messages_conversation_drops_every_marker_and_keeps_unmarked_objects(
    messages: list[Any], system: Any
) -> None:
    conversation = DIALECTS["/v1/messages"].conversation({"system": system,
                                                           "messages": messages})
    assert conversation == [{"system": _markers_dropped(system)},
                            *(_markers_dropped(m) for m in messages)]
    for sent, seen in zip(messages, conversation[1:], strict=True):
        if sent == _markers_dropped(sent):  # nothing to drop: the client's own object
            assert seen is sent
