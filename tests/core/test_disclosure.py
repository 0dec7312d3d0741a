"""Disclosure rendering and placement: the one placement changes, nothing else does."""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from budgetproxy.config import DisclosureConfig
from budgetproxy.core import disclosure
from budgetproxy.core.fingerprint import Fingerprint

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
    """docs/disclosure.md: append "\\n\\n" + text (to the text of a list holding one text
    part too); a new text part when content is a list of other parts."""
    out = dict(message)
    content = message["content"]
    if isinstance(content, list) and len(content) == 1:
        lone = content[0]["text"]
        out["content"] = [{**content[0], "text": lone + "\n\n" + text if lone else text}]
    elif isinstance(content, list):
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
    """Each turn's client conversation extends the last; the upstream one must too.

    (A turn whose new messages open with tool replies had sent only some of an assistant's
    replies: `new_message` then moves its text past them, see the test below.)"""
    conversation: list[Any] = []
    earlier: list[tuple[int, int, int, str]] = []
    previous_upstream: list[Any] = []
    budget = len(turns) + 2
    for turn, extra in enumerate(turns, start=1):
        assume(placement == "last_message" or turn == 1 or extra[0]["role"] != "tool")
        conversation = [*conversation, *extra]
        prints = Fingerprint(conversation)
        text = disclosure.render(TEMPLATE, turn, budget, None)
        index = disclosure.placement_index(placement, len(conversation))
        replay = [(i, disclosure.render(TEMPLATE, t, budget, None))
                  for i, t in disclosure.replayable(earlier, prints)]
        assert len(replay) == len(earlier)  # an append-only conversation keeps every text
        upstream = disclosure.apply(conversation, placement, text, replay)
        assert upstream[: len(previous_upstream)] == previous_upstream
        previous_upstream = upstream
        assert index is not None
        n = len(conversation)
        earlier = [p for p in earlier if p[0] != index] + [(index, turn, n, prints.digest())]


@given(turns=st.lists(messages, min_size=2, max_size=5), cut=st.integers(0, 20),
       placement=st.sampled_from(["last_message", "new_message"]))
def test_a_rewritten_history_replays_only_texts_of_conversations_it_still_extends(
    turns: list[list[Any]], cut: int, placement: disclosure.Placement
) -> None:
    """After the client drops or edits messages, an earlier text is re-applied only when
    everything its turn sent is still there, unchanged, at the start."""
    earlier: list[tuple[int, int, int, str]] = []
    conversation: list[Any] = []
    for turn, extra in enumerate(turns, start=1):
        conversation = [*conversation, *extra]
        n = len(conversation)
        idx = disclosure.placement_index(placement, n)
        assert idx is not None
        earlier.append((idx, turn, n, Fingerprint(conversation).digest()))
    keep = cut % (len(conversation) + 1)
    rewritten = [*conversation[:keep], {"role": "user", "content": "a summary", "new": True}]
    replayed = disclosure.replayable(earlier, Fingerprint(rewritten))
    assert replayed == [(i, t) for i, t, n, _ in earlier if n <= keep]


def test_replayable_skips_texts_placed_before_an_edit() -> None:
    first = [{"role": "system", "content": "s"}, {"role": "user", "content": "a"}]
    second = [*first, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]
    placed = [(1, 1, 2, Fingerprint(first).digest()), (3, 2, 4, Fingerprint(second).digest())]
    assert disclosure.replayable(placed, Fingerprint([*second, {"role": "user", "content": "d"}])
                                 ) == [(1, 1), (3, 2)]
    edited = [first[0], {"role": "user", "content": "a, edited"}, *second[2:]]
    assert disclosure.replayable(placed, Fingerprint(edited)) == []
    late_edit = [*first, {"role": "assistant", "content": "b, edited"}, second[3]]
    assert disclosure.replayable(placed, Fingerprint(late_edit)) == [(1, 1)]
    # An entry without a digest (nothing recorded the conversation) is never replayed.
    assert disclosure.replayable([(1, 1, 2, "")], Fingerprint(first)) == []


def test_disclose_places_this_turns_text_and_replays_only_with_a_conversation() -> None:
    template = "Turn {turn} of {total}."
    first = [{"role": "system", "content": "s"}, {"role": "user", "content": "a"}]
    third = [*first, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]
    placed = [(1, 1, 2, Fingerprint(first).digest())]
    text, out = disclosure.disclose(third, template, "last_message", 2, 4, None, placed,
                                    Fingerprint(third))
    assert text == "Turn 2 of 4."
    assert [m["content"] for m in out] == ["s", "a\n\nTurn 1 of 4.", "b", "c\n\nTurn 2 of 4."]
    # history: drop (no conversation given): only this turn's text, the announced total used
    text, out = disclosure.disclose(third, template, "last_message", 2, 4, 10, placed)
    assert text == "Turn 2 of 10."
    assert [m["content"] for m in out] == ["s", "a", "b", "c\n\nTurn 2 of 10."]
    assert third[3] == {"role": "user", "content": "c"}  # the client's messages untouched


def test_new_message_never_parts_tool_calls_from_their_replies() -> None:
    """An earlier text placed after some of an assistant's tool replies goes back after all
    of them: a user message between an assistant's tool calls and a reply is refused."""
    call = {"role": "assistant", "content": None, "tool_calls": [
        {"id": f"c{i}", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        for i in (1, 2)]}
    msgs = [{"role": "user", "content": "go"}, call,
            {"role": "tool", "tool_call_id": "c1", "content": "r1"},
            {"role": "tool", "tool_call_id": "c2", "content": "r2"},
            {"role": "user", "content": "next"}]
    out = disclosure.apply(msgs, "new_message", "T3", [(3, "T1"), (1, "T0")])
    assert out == [msgs[0], {"role": "user", "content": "T0"}, call, msgs[2], msgs[3],
                   {"role": "user", "content": "T1"}, msgs[4],
                   {"role": "user", "content": "T3"}]
    # Replies running to the end: the earlier text goes just before this turn's own.
    out = disclosure.apply(msgs[:4], "new_message", "T2", [(3, "T1")])
    assert out == [*msgs[:4], {"role": "user", "content": "T1"},
                   {"role": "user", "content": "T2"}]


def test_render_fields() -> None:
    assert disclosure.render(TEMPLATE, 1, 5, None) == (
        "[Turn budget] Turn 1 of 5. 4 turns remain after this one."
    )
    assert disclosure.render("{used}/{total}:{remaining}", 5, 5, None) == "4/5:0"
    assert disclosure.render("{total} {remaining}", 3, 5, 10) == "10 7"
    # remaining never below 0, also when the announced total is smaller than the real budget
    assert disclosure.render("{remaining}", 7, 10, 4) == "0"


def test_the_default_template_reads_correctly_for_every_count() -> None:
    template = DisclosureConfig().template
    assert disclosure.render(template, 1, 5, None) == (
        "[Turn budget] Turn 1 of 5. 4 turns remain after this one.")
    assert disclosure.render(template, 4, 5, None) == (
        "[Turn budget] Turn 4 of 5. 1 turn remains after this one.")
    assert disclosure.render(template, 5, 5, None) == (
        "[Turn budget] Turn 5 of 5. 0 turns remain after this one.")


def test_earlier_texts_go_back_where_they_were() -> None:
    msgs = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": [{"type": "text", "text": "c"}, {"type": "text", "text": "d"}]},
    ]
    out = disclosure.apply(msgs, "last_message", "T2", [(0, "T1")])
    assert out[0] == {"role": "user", "content": "a\n\nT1"}
    assert out[1] is msgs[1]
    assert out[2]["content"] == [*msgs[2]["content"], {"type": "text", "text": "T2"}]
    # One text part takes the text as a string would: the same text in either shape.
    one = [{"role": "user", "content": [{"type": "text", "text": "a", "cache_control": {}}]}]
    assert disclosure.apply(one, "last_message", "T1")[0]["content"] == [
        {"type": "text", "text": "a\n\nT1", "cache_control": {}}]
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
    pending: list[str] = []
    for i in range(n):
        if i in idx:  # an earlier turn's own user message goes back before message i ...
            pending.append(f"T{i}")
        if msgs[i]["role"] != "tool":  # ... or after the tool replies that start there
            expected.extend({"role": "user", "content": t} for t in pending)
            pending = []
        expected.append(msgs[i])
    expected.extend({"role": "user", "content": t} for t in [*pending, text])
    assert disclosure.apply(msgs, "new_message", text, earlier) == expected


def test_edit_appends_and_inserts_leaving_untouched_items_the_clients() -> None:
    items = [{"t": "a"}, {"t": "b"}]
    out = disclosure.edit(items, {1: ["x", "y"]}, {0: ["n0"], 2: ["end"]},
               lambda item, t: {"t": item["t"] + t}, lambda t: {"new": t})
    assert out == [{"new": "n0"}, {"t": "a"}, {"t": "bxy"}, {"new": "end"}]
    assert out[1] is items[0]


def test_texts_renders_this_turn_and_replays_only_with_a_conversation() -> None:
    assert disclosure.texts("{turn}/{total}", 2, 5, None) == ("2/5", [])
    assert disclosure.texts("{turn}/{total}", 2, 5, 4, [(0, 1, 1, "1:x")], None) == ("2/4", [])


@given(chosen=st.lists(st.tuples(st.integers(0, 50), st.integers(1, 30)), max_size=20),
       total=st.integers(1, 30), announced=st.none() | st.integers(1, 30))
def test_earlier_texts_chosen_are_each_turns_text_rendered(
        chosen: list[tuple[int, int]], total: int, announced: int | None) -> None:
    """The texts of earlier turns a long episode re-applies (taken from a cache of rendered
    texts, in C) are each turn's text as `render` writes it, in the order chosen."""
    template = "[Turn budget] Turn {turn} of {total}. {turns_remain} after this one."
    _, again = disclosure.texts(template, 31, total, announced, chosen=chosen)
    assert again == [(idx, disclosure.render(template, turn, total, announced))
                     for idx, turn in chosen]


def _edit_plainly(items: list[Any], appends: dict[int, list[str]],
                  inserts: dict[int, list[str]]) -> list[Any]:
    """edit's rule, item by item: inserts before index i, then item i with its appends."""
    out: list[Any] = []
    for i in range(len(items) + 1):
        out += [("new", t) for t in inserts.get(i, ())]
        if i < len(items):
            item = items[i]
            for t in appends.get(i, ()):
                item = (item, t)
            out.append(item)
    return out


@given(items=st.lists(st.integers(), max_size=6),
       appends=st.dictionaries(st.integers(-2, 8), st.lists(st.text(max_size=2), max_size=2)),
       inserts=st.dictionaries(st.integers(-2, 8), st.lists(st.text(max_size=2), max_size=2)))
def test_edit_places_appends_and_inserts_as_the_item_by_item_rule(
    items: list[Any], appends: dict[int, list[str]], inserts: dict[int, list[str]]
) -> None:
    got = disclosure.edit(items, appends, inserts, lambda item, t: (item, t),
                          lambda t: ("new", t))
    assert got == _edit_plainly(items, appends, inserts)


# -- a long episode's turn starts from its previous turn's placed messages ------------------
_msg = st.fixed_dictionaries({
    "role": st.sampled_from(["user", "assistant", "tool"]),
    "content": st.text(max_size=5) | st.builds(
        lambda t: [{"type": "text", "text": t}], st.text(max_size=4)) | st.none()})
_texts = st.lists(st.tuples(st.integers(-1, 9), st.sampled_from(["x", "y", "z"])), max_size=5)


@given(messages=st.lists(_msg, min_size=1, max_size=8), data=st.data())
def test_placing_from_the_previous_turn_is_placing_from_scratch(
    messages: list[Any], data: Any
) -> None:
    """Whatever the earlier texts (some off the conversation, some on its last message,
    repeated), a turn started from its previous turn's placed messages sends what `apply`
    sends, and leaves the next turn what a turn started from scratch would."""
    k = data.draw(st.integers(1, len(messages)))
    before = data.draw(_texts)
    _, previous = disclosure.placed_last(copy.deepcopy(messages[:k]), "p", before)
    earlier = data.draw(st.sampled_from(["extends", "other"]))
    now = data.draw(_texts)
    if earlier == "extends" and previous is not None:
        now = [*previous.texts, *now]
    out, kept = disclosure.placed_last(messages, "t", now, previous)
    assert out == disclosure.apply(messages, "last_message", "t", now)
    scratch, kept_scratch = disclosure.placed_last(messages, "t", now)
    assert out == scratch and (kept is None) == (kept_scratch is None)
    if kept is not None and kept_scratch is not None:
        assert kept[:2] == kept_scratch[:2] and kept_scratch.base == 0
        if kept.base:  # what it took from the previous turn: all of that turn's messages
            assert previous is not None and kept.base == len(previous.messages)
            assert all(a is b for a, b in zip(out, previous.messages, strict=False))
    assert orjson.dumps(out) == orjson.dumps(disclosure.apply(messages, "last_message", "t", now))


def test_a_growing_conversation_takes_its_earlier_messages_from_the_previous_turn() -> None:
    """The path a long episode takes: the previous turn's placed messages are reused as they
    are (the same objects), and only the new ones get copies with texts."""
    convo = [{"role": "user", "content": "u1"}]
    out, kept = disclosure.placed_last(convo, "t1", [])
    for turn in range(2, 6):
        assert kept is not None
        convo = [*copy.deepcopy(convo), {"role": "assistant", "content": f"a{turn}"},
                 {"role": "user", "content": f"u{turn}"}]
        new, kept_now = disclosure.placed_last(convo, f"t{turn}", kept.texts, kept)
        assert all(a is b for a, b in zip(new, kept.messages, strict=False))
        assert new == disclosure.apply(convo, "last_message", f"t{turn}", kept.texts)
        out, kept = new, kept_now
    assert out[-1] == {"role": "user", "content": "u5\n\nt5"}
    assert [m["content"] for m in out[::2]] == [f"u{t}\n\nt{t}" for t in range(1, 6)]
