"""A Messages turn read on from the previous one (its `Raw` and placed items) is the turn read
whole: the same conversation and the same prompt for the upstream, byte for byte, over
sessions that move cache markers, flip a message's shape, end on an assistant or a system
message, resend a turn, and rewrite their history."""

from __future__ import annotations

import copy
import json
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from budgetproxy.core.disclosure import Disclosed
from budgetproxy.core.prefixes import Prefix, Raw, written
from budgetproxy.proxy.dialects import DIALECTS

MESSAGES = DIALECTS["/v1/messages"]
MARK = {"type": "ephemeral"}

# What a turn does to the session before it is sent: add a user prompt (a string or a block),
# add a tool round (an assistant tool call, its result), add an assistant reply with no user
# message after it, a system message after the last user message (Claude Code does), rewrite
# the first message, or send the same body again; or a turn whose earlier texts leave one
# out (`forget`: a proof of the history that the choice of texts did not share).
_STEPS = st.sampled_from(["prompt", "prompt-block", "tool", "assistant", "trailing-system",
                          "rewrite", "same", "forget"])


def _grow(history: list[dict[str, Any]], step: str, t: int) -> list[dict[str, Any]]:
    if step == "prompt":
        return [*history, {"role": "assistant", "content": f"a{t}"},
                {"role": "user", "content": f"u{t}"}]
    if step == "prompt-block":
        return [*history, {"role": "assistant", "content": [{"type": "text", "text": f"a{t}"}]},
                {"role": "user", "content": [{"type": "text", "text": f"u{t}"}]}]
    if step == "tool":
        return [*history, {"role": "assistant", "content": [
            {"type": "tool_use", "id": f"t{t}", "name": "Bash", "input": {"cmd": f"ls {t}"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": f"t{t}",
                 "content": [{"type": "text", "text": f"out {t}"}]}]}]
    if step == "assistant":
        return [*history, {"role": "assistant", "content": f"only {t}"}]
    if step == "trailing-system":
        return [*history, {"role": "system", "content": f"note {t}"}]
    if step == "rewrite":
        return [{"role": "user", "content": f"summary {t}"}, *history[1:]]
    if step == "forget":
        return [*history, {"role": "assistant", "content": f"a{t}"},
                {"role": "user", "content": f"u{t}"}]
    return history


def _marked(history: list[dict[str, Any]], first_marked: bool) -> list[dict[str, Any]]:
    """The body's messages as Claude Code sends them: the newest message's last block marked
    (a string made a block), and the first prompt marked from the second turn on."""
    out = copy.deepcopy(history)
    for i in ([0] if first_marked else []) + [len(out) - 1]:
        content = out[i]["content"]
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        out[i]["content"] = [*content[:-1], {**content[-1], "cache_control": MARK}]
    return out


@settings(max_examples=150, deadline=None)
@given(steps=st.lists(_STEPS, min_size=1, max_size=12), system_marked=st.booleans())
def test_a_turn_read_on_from_the_previous_one_is_the_turn_read_whole(
    steps: list[str], system_marked: bool
) -> None:
    system: Any = [{"type": "text", "text": "sys", **({"cache_control": MARK}
                                                      if system_marked else {})}]
    history: list[dict[str, Any]] = [{"role": "user", "content": "u0"}]
    raw: Raw | None = None
    kept: Prefix | None = None
    placed: Disclosed | None = None
    again: list[tuple[int, str]] = []  # each turn's text at its place, as history: keep has it
    for t, step in enumerate(["first", *steps]):
        history = _grow(history, step, t)
        body = orjson.dumps({"model": "m", "max_tokens": 8, "system": system,
                             "messages": _marked(history, first_marked=t > 0)})
        whole, on = orjson.loads(body), orjson.loads(body)
        read = MESSAGES.conversation_from(on, raw)
        assert read.conversation == MESSAGES.conversation(whole)
        assert orjson.dumps(read.conversation) == orjson.dumps(MESSAGES.conversation(whole))
        # its bytes, the proven entries' taken from the previous turn's: orjson's writing
        now = written(read.conversation, kept, 1 + read.proven if read.proven else 0)
        assert now == orjson.dumps(MESSAGES.conversation(whole)), (t, step)
        assert now is not None
        kept = Prefix(now, len(read.conversation), None, True, raw=read.raw)
        if step == "forget" and again:
            again = again[1:]
        text = f"[text of turn {t}]"
        index = MESSAGES.placement_index("last_message", read.conversation)
        expected, _ = MESSAGES.place(whole, MESSAGES.conversation(whole), "last_message", text,
                                     list(again))
        got, placed = MESSAGES.place(on, read.conversation, "last_message", text, list(again),
                                     placed, read.proven)
        assert orjson.dumps(got) == orjson.dumps(expected), (t, step)
        raw = read.raw
        if step == "rewrite":
            again = []  # (the earlier texts no longer apply)
        if index is not None:
            again = [*again, (index, text)]


def test_a_long_session_reads_only_its_new_messages() -> None:
    """From the second turn on, only the messages after the previous turn's proven ones are
    read again, and the previous turn's placed items stand for the rest."""
    history: list[dict[str, Any]] = [{"role": "user", "content": "u0"}]
    raw: Raw | None = None
    placed: Disclosed | None = None
    again: list[tuple[int, str]] = []
    previous: list[Any] = []
    for t in range(1, 30):
        history = _grow(history, "tool", t)
        payload = orjson.loads(orjson.dumps({"model": "m", "system": "sys",
                                             "messages": _marked(history, t > 1)}))
        read = MESSAGES.conversation_from(payload, raw)
        if t > 2:  # (the first turn's head holds no message: its only one is its newest)
            assert read.proven == len(payload["messages"]) - 3  # all but the newest three
            assert read.conversation[1] is raw.conversation[1]  # (taken, not read again)
        payload, placed = MESSAGES.place(payload, read.conversation, "last_message", f"x{t}",
                                         list(again), placed, read.proven)
        assert placed is not None
        if t > 3:
            assert payload["messages"][1] is previous[1]  # (the previous turn's placed item)
        previous = payload["messages"]
        raw = read.raw
        again.append((len(read.conversation) - 1, f"x{t}"))


def test_a_text_that_lands_among_the_items_taken_makes_the_turn_placed_whole() -> None:
    """A text whose own item is no user message joins the user message before it: when that
    one is among the items taken from the previous turn, they are not taken."""
    items = [{"role": "user", "content": "u0"}, {"role": "user", "content": "u1"},
             {"role": "assistant", "content": "a1"}, {"role": "user", "content": "u2"}]
    previous = Disclosed([items[0], {"role": "user", "content": "u1\n\nold"}], [(2, "old")])
    again = [(2, "old"), (3, "on a1")]  # (a1 is item 2: its text joins u1, item 1)
    payload = {"model": "m", "system": "s", "messages": items}
    whole, _ = MESSAGES.place(copy.deepcopy(payload), MESSAGES.conversation(payload),
                              "last_message", "now", list(again))
    got, _ = MESSAGES.place(copy.deepcopy(payload), MESSAGES.conversation(payload),
                            "last_message", "now", list(again), previous, 2)
    assert got == whole
    assert got["messages"][1]["content"] == [{"type": "text", "text": "u1"},
                                             {"type": "text", "text": "old"},
                                             {"type": "text", "text": "on a1"}]


def test_floatless_says_whether_the_unproven_items_hold_a_float_past_64_bits() -> None:
    """`floatless` covers the items after the proven ones (all, with none proven), as orjson
    writes them, markers included: a float an integer past 64 bits became there, or a text
    holding `e+`, makes it False (the values are then walked); so does such an item that was
    the newest last turn, read again once its marker moves off; clean new messages leave it
    True, whatever the proven items hold."""
    big = 123456789012345678901234567891  # orjson reads it as a float, writes it with e+
    history: list[dict[str, Any]] = [{"role": "user", "content": "u0"}]
    raw: Raw | None = None
    for t in range(1, 8):
        history = _grow(history, "tool", t)
        if t == 3:  # a new message with such a float
            history[-1] = {**history[-1], "n": big}
        if t == 4:  # a new text holding e+ (no float: still walked)
            history[-1] = {"role": "user", "content": "1e+5 is a float"}
        payload = orjson.loads(json.dumps({"model": "m", "system": "sys",
                                           "messages": _marked(history, t > 1)}))
        read = MESSAGES.conversation_from(payload, raw)
        assert read.floatless == (t not in (3, 4, 5)), t
        if t == 6:  # the float of turn 3 is among the proven items now
            assert read.proven >= 5 and any("n" in m for m in payload["messages"][:read.proven])
        raw = read.raw
    # with none proven, every item is looked at
    payload = orjson.loads(json.dumps({"model": "m", "system": "sys",
                                       "messages": _marked(history, True)}))
    assert not MESSAGES.conversation_from(payload, None).floatless
