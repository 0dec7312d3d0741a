"""Conversation fingerprints: a conversation extends an earlier one exactly when it starts
with all of that one's messages, unchanged."""

from __future__ import annotations

import hashlib
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from budgetproxy.core.fingerprint import Fingerprint, canonical

# Text values only: messages are equal JSON exactly when they are equal with their keys in
# the same order (a client that reorders keys has changed its conversation, as far as the
# proxy can tell: it is logged whole, never wrongly cut).
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant", "tool"]),
     "content": st.text(max_size=12) | st.lists(st.text(max_size=4), max_size=2)},
    optional={"tool_call_id": st.sampled_from(["c1", "c2"])},
)
conversations = st.lists(message, min_size=1, max_size=6)


@given(before=conversations, after=st.lists(message, max_size=4))
def test_an_appended_conversation_extends_the_earlier_one(
    before: list[Any], after: list[Any]
) -> None:
    assert Fingerprint([*before, *after]).extends(Fingerprint(before).digest())


@given(before=conversations, now=st.lists(message, max_size=8))
def test_extends_exactly_when_the_earlier_messages_start_the_conversation(
    before: list[Any], now: list[Any]
) -> None:
    expected = orjson.dumps(now[: len(before)]) == orjson.dumps(before)
    assert Fingerprint(now).extends(Fingerprint(before).digest()) == expected


def test_long_conversations_across_the_kept_hash_states() -> None:
    """Messages of several kilobytes: prefixes end anywhere relative to the kept states."""
    msgs = [{"role": "user", "content": f"{i}:" + "x" * (1500 * i)} for i in range(1, 12)]
    full = Fingerprint(msgs)
    for k in range(1, len(msgs) + 1):
        assert full.extends(Fingerprint(msgs[:k]).digest()), k
        edited = [*msgs[: k - 1], {"role": "user", "content": msgs[k - 1]["content"] + "!"}]
        assert not full.extends(Fingerprint(edited).digest()), k


def test_unknown_and_malformed_digests_match_nothing() -> None:
    f = Fingerprint([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
    for digest in (None, "", "abc", "3:", "-1:00", "999:00", f.digest() + "0"):
        assert not f.extends(digest), digest
    # A message that only starts like the earlier one is a different message.
    assert not Fingerprint([{"role": "user", "content": "ab"}]).extends(
        Fingerprint([{"role": "user", "content": "a"}]).digest())
    assert not Fingerprint(["ab"]).extends(Fingerprint(["a"]).digest())
    assert not Fingerprint([12]).extends(Fingerprint([1]).digest())


def test_values_only_the_standard_library_writes_still_compare() -> None:
    big = [{"role": "user", "content": "n", "n": 2**70}]
    assert Fingerprint([*big, {"role": "user", "content": "more"}]).extends(
        Fingerprint(big).digest())
    assert not Fingerprint([{"role": "user", "content": "n", "n": 2**70 + 1}]).extends(
        Fingerprint(big).digest())


@given(st.lists(st.integers(0, 4000), min_size=1, max_size=12), st.data())
def test_extends_each_agrees_with_extends_one_by_one(sizes: list[int], data: Any) -> None:
    """The one-pass check of many earlier placements answers as checking each does."""
    msgs = [{"role": "user", "content": f"{i}:" + "y" * n} for i, n in enumerate(sizes)]
    digests = [Fingerprint(msgs[:k]).digest() for k in range(1, len(msgs) + 1)]
    digests += [Fingerprint([*msgs[: k - 1], {"role": "user", "content": "edited"}]).digest()
                for k in range(1, len(msgs) + 1)]
    digests += ["", "12:zz", "bad"]
    order = data.draw(st.permutations(digests))
    checked = [Fingerprint(msgs).extends(d) for d in order]
    assert Fingerprint(msgs).extends_each(order) == checked


@given(before=conversations, after=st.lists(message, max_size=3), data=st.data())
def test_string_content_and_one_text_block_are_the_same_message(
    before: list[Any], after: list[Any], data: st.DataObject
) -> None:
    """Flipping any earlier message between a string and one text block (annotations and
    all) keeps the conversation an extension of the earlier one."""
    flipped = []
    for m in before:
        if isinstance(m["content"], str) and data.draw(st.booleans()):
            block = {"type": data.draw(st.sampled_from(["text", "input_text"])),
                     "text": m["content"]}
            if data.draw(st.booleans()):
                block["cache_control"] = {"type": "ephemeral"}
            m = {**m, "content": [block]}
        flipped.append(m)
    assert Fingerprint([*flipped, *after]).extends(Fingerprint(before).digest())
    assert Fingerprint([*before, *after]).extends(Fingerprint(flipped).digest())


def _sha256_digest(messages: list[Any]) -> str:
    """A digest as versions before BLAKE3 kept it: "<length>:<SHA-256, 128 bits>"."""
    blob = orjson.dumps(messages)[:-1]
    return f"{len(blob)}:{hashlib.sha256(blob).hexdigest()[:32]}"


@pytest.mark.parametrize("size", [40, 80_000])  # one pass, and across the kept hash states
def test_a_digest_an_earlier_version_kept_is_still_compared(size: int) -> None:
    before = [{"role": "user", "content": "x" * size}]
    after = [*before, {"role": "assistant", "content": "y"}]
    old = _sha256_digest(before)
    assert Fingerprint(after).extends(old)
    assert not Fingerprint([{"role": "user", "content": "z" * size}, *after[1:]]).extends(old)
    assert not Fingerprint(after).extends(old[:-1] + ("0" if old[-1] != "0" else "1"))
    assert "/" in Fingerprint(after).digest()  # new digests: BLAKE3's


def _canonical_plainly(item: Any) -> Any:
    """The canonical shape, written plainly: content (or output, or system) that is a list of
    one text block is its text, blocks' content lists are canonical too, and a Responses
    item's `type: message` is dropped."""
    if not isinstance(item, dict):
        return item
    out = {k: v for k, v in item.items() if not (k == "type" and v == "message")}
    for key in ("content", "output", "system"):
        value = item.get(key)
        if not isinstance(value, list):
            continue
        if (len(value) == 1 and isinstance(value[0], dict)
                and value[0].get("type") in ("text", "input_text")
                and isinstance(value[0].get("text"), str)):
            out[key] = value[0]["text"]
        else:
            out[key] = [_canonical_plainly(b) if isinstance(b, dict)
                        and isinstance(b.get("content"), list) else b for b in value]
    return out


_text_block = st.fixed_dictionaries({"type": st.sampled_from(["text", "input_text"]),
                                     "text": st.text(max_size=3)},
                                    optional={"cache_control": st.just({"type": "ephemeral"})})
_other_block = st.fixed_dictionaries(
    {"type": st.sampled_from(["tool_use", "tool_result", "image"])},
    optional={"content": st.text(max_size=3) | st.lists(_text_block, max_size=2),
              "id": st.text(max_size=2)})
_blocks = st.lists(_text_block | _other_block, max_size=3)
_item = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant"]), "content": st.text(max_size=3) | _blocks},
    optional={"type": st.sampled_from(["message", "function_call_output"]),
              "output": st.text(max_size=2) | _blocks})


@given(messages=st.lists(_item | st.fixed_dictionaries({"system": _blocks}), max_size=5))
def test_canonical_is_the_plain_rule_and_keeps_unchanged_messages(messages: list[Any]) -> None:
    out = canonical(messages)
    assert out == [_canonical_plainly(m) for m in messages]
    for before, after in zip(messages, out, strict=True):
        if before == _canonical_plainly(before):
            assert after is before


# -- hashing on from the previous turn (core/prefixes.py) -----------------------------------
shaped = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant"]),
     "content": st.text(max_size=8) | st.builds(
         lambda t, marked: [{"type": "text", "text": t, **(
             {"cache_control": {"type": "ephemeral"}} if marked else {})}],
         st.text(max_size=6), st.booleans())},
)


def _same(a: Fingerprint, b: Fingerprint, probes: list[list[Any]]) -> None:
    assert a.digest() == b.digest()
    assert a.tail().length == b.tail().length and a.tail().digest == b.tail().digest
    for p in probes:
        d = Fingerprint(p).digest()
        assert a.extends(d) == b.extends(d), p


@given(turns=st.lists(st.lists(shaped | message, min_size=1, max_size=3), min_size=1,
                      max_size=5),
       probes=st.lists(st.lists(shaped | message, min_size=1, max_size=6), max_size=3))
def test_a_fingerprint_hashed_on_from_the_previous_turn_is_the_whole_conversations(
    turns: list[list[Any]], probes: list[list[Any]]
) -> None:
    """Turn after turn, each extended from the one before: the same digest, tail and answers
    as the whole conversation fingerprinted from scratch (its prefixes included)."""
    conversation = list(turns[0])
    prints = Fingerprint(conversation)
    for new in turns[1:]:
        before = len(conversation)
        prefixes = [conversation[:k] for k in range(1, before + 1)]
        conversation = [*conversation, *new]
        extended = Fingerprint.extending(conversation, prints.tail(), before)
        assert extended is not None
        _same(extended, Fingerprint(conversation), [*prefixes, *probes])
        prints = extended


def test_hashing_on_across_the_kept_hash_states() -> None:
    """Messages of several kilobytes, the previous turn's end anywhere between kept states;
    an earlier digest asked about writes the whole conversation after all."""
    msgs = [{"role": "user", "content": f"{i}:" + "x" * (1500 * i)} for i in range(1, 14)]
    prints = Fingerprint(msgs[:1])
    for k in range(2, len(msgs) + 1):
        extended = Fingerprint.extending(msgs[:k], prints.tail(), k - 1)
        assert extended is not None
        _same(extended, Fingerprint(msgs[:k]), [msgs[:j] for j in range(1, k + 1)])
        prints = extended


def test_what_cannot_be_hashed_on_is_fingerprinted_whole() -> None:
    tail = Fingerprint([{"role": "user", "content": "a"}]).tail()
    deep: Any = "x"
    for _ in range(300):  # past orjson's 254 levels
        deep = [deep]
    assert Fingerprint.extending([{"role": "user", "content": "a"}, {"role": "user",
                                  "content": deep}], tail, 1) is None
    assert Fingerprint.extending([{"role": "user", "content": "a"}], tail, 0) is None
    same = Fingerprint.extending([{"role": "user", "content": "a"}], tail, 1)
    assert same is not None and same.digest() == tail.digest
