"""What an episode's next turn takes from its previous one: only a conversation that starts
with the previous one's messages, byte for byte, and adds to them."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from budgetproxy.core.fingerprint import Fingerprint
from budgetproxy.core.prefixes import Prefix, Prefixes, extended, written


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


def test_kept_up_to_the_byte_limit_least_recent_episode_first() -> None:
    one = prefix([{"role": "user", "content": "x" * 100}])
    size = len(one.written)
    kept = Prefixes(max_bytes=3 * size)
    for eid in ("e1", "e2", "e3"):
        kept.keep(eid, one)
    assert kept.size == 3 * size
    kept.keep("e1", one)  # e1 called again: e2 is now the least recent
    kept.keep("e4", one)
    assert kept.get("e2") is None and kept.get("e1") is one and kept.get("e4") is one
    assert kept.size == 3 * size
    kept.keep("e1", prefix([A]))  # replaced: its bytes counted once
    assert kept.size == 2 * size + len(written([A]) or b"")
    kept.drop("e1")
    assert kept.get("e1") is None and kept.size == 2 * size
    kept.keep("huge", prefix([{"role": "user", "content": "y" * 400}]))  # past the limit
    assert kept.get("huge") is None and kept.size == 2 * size
