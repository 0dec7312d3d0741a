"""Disclosure rendering and placement: the one placement changes, nothing else does."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from budgetproxy.core import disclosure

TEMPLATE = "[Turn budget] Turn {turn} of {total}. {remaining} turns remain after this one."

text_parts = st.lists(
    st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=10)}), max_size=3
)
contents = st.one_of(st.text(min_size=1, max_size=20), text_parts)
messages = st.lists(
    st.fixed_dictionaries(
        {
            "role": st.sampled_from(["system", "user", "assistant", "tool"]),
            "content": contents,
        },
        optional={"name": st.text(max_size=5), "tool_call_id": st.text(max_size=5)},
    ),
    min_size=1,
    max_size=8,
)
texts = st.text(min_size=1, max_size=30)


def appended(message: dict[str, Any], text: str) -> dict[str, Any]:
    """CONTRACT: append "\\n\\n" + text; a new text part when content is a list of parts."""
    out = dict(message)
    if isinstance(message["content"], list):
        out["content"] = [*message["content"], {"type": "text", "text": text}]
    else:
        out["content"] = message["content"] + "\n\n" + text
    return out


@given(msgs=messages, text=texts)
def test_last_message_changes_only_the_last_message(msgs: list[Any], text: str) -> None:
    before = copy.deepcopy(msgs)
    out = disclosure.apply(msgs, "last_message", text)
    assert msgs == before  # the client's list is never mutated
    assert len(out) == len(msgs)
    assert out[:-1] == msgs[:-1]
    assert out[-1] == appended(msgs[-1], text)


@given(msgs=messages, text=texts)
def test_system_appends_to_the_first_system_message_or_creates_one(
    msgs: list[Any], text: str
) -> None:
    before = copy.deepcopy(msgs)
    out = disclosure.apply(msgs, "system", text)
    assert msgs == before
    first = next((i for i, m in enumerate(msgs) if m["role"] == "system"), None)
    if first is None:
        assert out == [{"role": "system", "content": text}, *msgs]
    else:
        assert len(out) == len(msgs)
        assert out[first] == appended(msgs[first], text)
        assert out[:first] == msgs[:first] and out[first + 1 :] == msgs[first + 1 :]


@given(msgs=messages, text=texts)
def test_new_message_appends_a_user_message(msgs: list[Any], text: str) -> None:
    before = copy.deepcopy(msgs)
    out = disclosure.apply(msgs, "new_message", text)
    assert msgs == before
    assert out == [*msgs, {"role": "user", "content": text}]


@given(turns=st.lists(messages, min_size=1, max_size=5), placement=st.sampled_from(
    ["last_message", "new_message"]))
def test_history_keep_makes_the_upstream_conversation_append_only(
    turns: list[list[Any]], placement: disclosure.Placement
) -> None:
    """Each turn's client conversation extends the last; the upstream one must too."""
    conversation: list[Any] = []
    earlier: list[tuple[int, int]] = []
    previous_upstream: list[Any] = []
    budget = len(turns) + 2
    for turn, extra in enumerate(turns, start=1):
        conversation = [*conversation, *extra]
        text = disclosure.render(TEMPLATE, turn, budget, None)
        index = disclosure.placement_index(placement, len(conversation))
        replay = [(i, disclosure.render(TEMPLATE, t, budget, None)) for i, t in earlier]
        upstream = disclosure.apply(conversation, placement, text, replay)
        assert upstream[: len(previous_upstream)] == previous_upstream
        previous_upstream = upstream
        assert index is not None
        earlier = [p for p in earlier if p[0] != index] + [(index, turn)]


def test_render_fields() -> None:
    assert disclosure.render(TEMPLATE, 1, 5, None) == (
        "[Turn budget] Turn 1 of 5. 4 turns remain after this one."
    )
    assert disclosure.render("{used}/{total}:{remaining}", 5, 5, None) == "4/5:0"
    assert disclosure.render("{total} {remaining}", 3, 5, 10) == "10 7"
    # remaining never below 0, also when the announced total is smaller than the real budget
    assert disclosure.render("{remaining}", 7, 10, 4) == "0"


def test_earlier_texts_go_back_where_they_were() -> None:
    msgs = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": [{"type": "text", "text": "c"}]},
    ]
    out = disclosure.apply(msgs, "last_message", "T2", [(0, "T1")])
    assert out[0] == {"role": "user", "content": "a\n\nT1"}
    assert out[1] is msgs[1]
    assert out[2]["content"] == [{"type": "text", "text": "c"}, {"type": "text", "text": "T2"}]
    # An index that no longer fits (the client rewrote its history) is skipped.
    assert disclosure.apply(msgs[:1], "last_message", "T2", [(5, "T1")]) == [
        {"role": "user", "content": "a\n\nT2"}
    ]


@pytest.mark.parametrize(
    ("placement", "count", "index"),
    [("last_message", 3, 2), ("new_message", 3, 3), ("system", 3, None)],
)
def test_placement_index(placement: disclosure.Placement, count: int, index: int | None) -> None:
    assert disclosure.placement_index(placement, count) == index


@given(msgs=messages, text=texts, data=st.data())
def test_keep_changes_only_the_remembered_places(
    msgs: list[Any], text: str, data: st.DataObject
) -> None:
    n = len(msgs)
    idx = data.draw(st.lists(st.integers(0, n + 3), max_size=4, unique=True))
    earlier = [(i, f"T{i}") for i in idx]
    before = copy.deepcopy(msgs)
    out = disclosure.apply(msgs, "last_message", text, earlier)
    assert msgs == before
    assert len(out) == n
    touched = {i for i in idx if i < n - 1}  # out-of-range places are skipped
    for i in range(n - 1):
        assert out[i] == (appended(msgs[i], f"T{i}") if i in touched else msgs[i])
    assert out[-1] == appended(msgs[-1], text)
    expected: list[Any] = []
    for i in range(n):
        if i in idx:  # an earlier turn's own user message goes back before message i
            expected.append({"role": "user", "content": f"T{i}"})
        expected.append(msgs[i])
    expected.append({"role": "user", "content": text})
    assert disclosure.apply(msgs, "new_message", text, earlier) == expected
