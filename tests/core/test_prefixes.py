"""What an episode's next turn takes from its previous one: only a conversation that starts
with the previous one's messages, byte for byte, and adds to them."""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from budgetproxy.core.disclosure import placed_last
from budgetproxy.core.fingerprint import Fingerprint
from budgetproxy.core.prefixes import TAIL_FROM, Prefix, Prefixes, extended, written


def prefix(conversation: list[Any], lossless: bool = True) -> Prefix:
    w = written(conversation)
    assert w is not None
    return Prefix(w, len(conversation), Fingerprint(conversation).tail(), lossless)


A = {"role": "user", "content": "a"}
B = {"role": "assistant", "content": "b"}
C = {"role": "user", "content": "c"}


def test_a_conversation_that_adds_messages_extends_the_previous_one() -> None:
    previous = prefix([A, B])
    assert extended(previous, written([A, B, C])) is previous


@pytest.mark.parametrize("now", [
    [A, B],  # nothing added
    [A],  # shorter
    [A, {"role": "assistant", "content": "bb"}, C],  # a message that only starts the same
    [A, {"content": "b", "role": "assistant"}, C],  # keys reordered
    [{"role": "user", "content": [{"type": "text", "text": "a"}]}, B, C],  # shape flipped
    [B, A, C],
])
def test_anything_else_does_not(now: list[Any]) -> None:
    assert extended(prefix([A, B]), written(now)) is None


@pytest.mark.parametrize("before,after", [(1, True), (1, 1.0), (0, False), (0.0, -0.0)])
def test_values_python_calls_equal_but_json_writes_differently_do_not(
    before: Any, after: Any
) -> None:
    """`1 == True == 1.0` in Python; on the wire they differ, so a turn that changed one is
    not taken from the previous turn."""
    previous = prefix([{"role": "user", "content": "a", "n": before}])
    assert extended(previous, written([{"role": "user", "content": "a", "n": after}, B])) is None


@given(before=st.lists(st.text(max_size=3), min_size=1, max_size=4),
       now=st.lists(st.text(max_size=3), max_size=6))
def test_extended_exactly_when_the_previous_messages_start_the_conversation(
    before: list[str], now: list[str]
) -> None:
    expected = len(now) > len(before) and now[: len(before)] == before
    assert (extended(prefix(before), written(now)) is not None) == expected


def test_nothing_to_compare_with() -> None:
    assert extended(None, written([A])) is None
    assert extended(prefix([A]), None) is None
    deep: Any = "x"
    for _ in range(300):  # past orjson's 254 levels
        deep = [deep]
    assert written([deep]) is None


def _counted(p: Prefix) -> int:
    probe = Prefixes()
    probe.keep("probe", p)
    return probe.size


def test_kept_up_to_the_byte_limit_least_recent_episode_first() -> None:
    one = prefix([{"role": "user", "content": "x" * 100}])
    size = _counted(one)
    assert size > len(one.written)  # (the entry's own objects are counted too)
    kept = Prefixes(max_bytes=3 * size)
    for eid in ("e1", "e2", "e3"):
        kept.keep(eid, one)
    assert kept.size == 3 * size
    kept.keep("e1", one)  # e1 called again: e2 is now the least recent
    kept.keep("e4", one)
    assert kept.get("e2") is None and kept.get("e1") is one and kept.get("e4") is one
    assert kept.size == 3 * size
    kept.keep("e1", prefix([A]))  # replaced: its bytes counted once
    assert kept.size == 2 * size + _counted(prefix([A]))
    kept.drop("e1")
    assert kept.get("e1") is None and kept.size == 2 * size
    huge = prefix([{"role": "user", "content": "y" * 4 * size}])  # past the limit
    kept.keep("huge", huge)
    assert kept.get("huge") is None and kept.size == 2 * size


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def _short(i: int) -> Prefix:
    return prefix([{"role": "user", "content": f"hi {i}"}])


def _long(i: int) -> Prefix:  # past TAIL_FROM: its hash state is kept
    conversation = [{"role": "user", "content": f"{i} " + "x" * 40_000}]
    w = written(conversation)
    assert w is not None and len(w) >= TAIL_FROM
    return Prefix(w, 1, Fingerprint(conversation).tail(), True)


def _placed(i: int) -> Prefix:  # a thousand short messages, with their texts placed
    conversation = orjson.loads(orjson.dumps(
        [{"role": "user", "content": f"{i} {k}"} for k in range(1000)]))
    _, placed = placed_last(conversation, "t", [(k, "x") for k in range(0, 998, 2)])
    w = written(conversation)
    assert w is not None and placed is not None
    return Prefix(w, len(conversation), None, True, placed)


@pytest.mark.parametrize(("make", "count"), [(_short, 60_000), (_long, 400), (_placed, 60)])
def test_what_is_kept_stays_within_about_its_limit(
    make: Callable[[int], Prefix], count: int
) -> None:
    """The limit counts what a kept Prefix holds, not only its conversation's bytes: many
    short episodes (their entries' own objects), long ones (a hash state each), and placed
    messages (a parse's objects and their copies) stay near it, measured by RSS."""
    limit = 8 << 20
    kept = Prefixes(max_bytes=limit)
    gc.collect()
    before = _rss()
    for i in range(count):
        kept.keep(f"e{i}", make(i))
    gc.collect()
    grown = _rss() - before
    assert limit // 2 < kept.size <= limit  # (full: the episodes are more than it holds)
    assert grown < 2 * limit, f"{grown / 1e6:.1f} MB held for {kept.size / 1e6:.1f} MB counted"


_SHAPES = st.sampled_from(["str", "lone", "lone-marked", "blocks"])


def _message(i: int, shape: str) -> dict[str, Any]:
    text = f"message {i}"
    if shape == "str":
        return {"role": "user", "content": text}
    if shape == "blocks":
        return {"role": "user", "content": [{"type": "text", "text": text},
                                            {"type": "text", "text": "more"}]}
    block: dict[str, Any] = {"type": "text", "text": text}
    if shape == "lone-marked":
        block["cache_control"] = {"type": "ephemeral"}
    return {"role": "user", "content": [block]}


@given(turns=st.lists(st.tuples(st.lists(_SHAPES, min_size=0, max_size=3),
                                st.booleans(), _SHAPES), min_size=1, max_size=6))
def test_a_turn_fingerprinted_from_the_previous_one_is_one_fingerprinted_from_scratch(
    turns: list[tuple[list[str], bool, str]]
) -> None:
    """`fingerprint` looks only at what is new where the previous turn allows it: its digest,
    and what it says of the previous turn's digest and an older one's, are those of the
    conversation fingerprinted whole, over turns that add messages in every shape, flip an
    earlier message's shape (no longer the previous turn's bytes) or add nothing."""
    from budgetproxy.core.prefixes import fingerprint, kept_tail

    conversation: list[Any] = []
    kept: Prefix | None = None
    digests: list[str] = []
    for added, flip, flipped_to in turns:
        conversation = conversation + [_message(len(conversation) + i, shape)
                                       for i, shape in enumerate(added)]
        if flip and conversation:
            conversation = [_message(0, flipped_to), *conversation[1:]]
        if not conversation:
            continue
        now = written(conversation)
        assert now is not None
        prints = fingerprint(extended(kept, now), conversation, now)
        whole = Fingerprint(conversation)
        assert prints.digest() == whole.digest()
        if prints.as_written:  # (a claim the next turn relies on: never made wrongly)
            assert whole.as_written
        for earlier in digests[-2:]:
            assert prints.extends(earlier) == Fingerprint(conversation).extends(earlier)
        digests.append(whole.digest())
        kept = Prefix(now, len(conversation), kept_tail(prints, now), True,
                      as_written=prints.as_written)


def test_checked_other_values_are_kept_one_per_length_and_bounded() -> None:
    """A lookup is one comparison of bytes: the values of the same length kept last, the
    oldest length dropped first past `max_entries`, none larger than `max_bytes`."""
    from budgetproxy.core.prefixes import CheckedOthers

    checked = CheckedOthers(max_entries=2, max_bytes=8)
    checked.add(b"[1,2]")
    assert b"[1,2]" in checked and b"[1,3]" not in checked  # (same length, other bytes)
    checked.add(b"[1,3]")
    assert b"[1,3]" in checked and b"[1,2]" not in checked
    checked.add(b"[10,2]")
    checked.add(b"[100,2]")  # a third length: the oldest goes
    assert b"[1,3]" not in checked and b"[10,2]" in checked and b"[100,2]" in checked
    checked.add(b"[1000,20]")  # past max_bytes: not kept
    assert b"[1000,20]" not in checked
