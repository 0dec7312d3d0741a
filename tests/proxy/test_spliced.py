"""proxy/spliced.py: a disclosed turn's body written from the previous turn's is, byte for
byte, orjson's writing of its payload (a differential test over generated payloads)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from budgetproxy.core.prefixes import SentBody
from budgetproxy.proxy.spliced import spliced, written

_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1),
                     st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=20))
_VALUES = st.recursive(_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12)
_MESSAGES = st.lists(st.dictionaries(st.sampled_from(["role", "content", "name", "x"]), _VALUES,
                                     min_size=1), min_size=1, max_size=5)
_OTHERS = st.dictionaries(st.text(max_size=10).filter(lambda k: k != "messages"), _VALUES,
                          max_size=4)


def _payload(others: dict[str, Any], at: int, messages: list[Any]) -> dict[str, Any]:
    items = list(others.items())
    at = min(at, len(items))
    return dict([*items[:at], ("messages", messages), *items[at:]])


def _held(into: SentBody, items: list[Any]) -> None:
    """What `into` keeps is orjson's writing of `items`, `cut` where the last one starts."""
    assert into.items == orjson.dumps(items) and into.count == len(items)
    if len(items) > 1:
        assert into.items[:into.cut] + b"]" == orjson.dumps(items[:-1])


@settings(max_examples=300)
@given(first=_MESSAGES, more=_MESSAGES, others=_OTHERS, later=_OTHERS,
       at=st.integers(0, 4), later_at=st.integers(0, 4), remarked=st.booleans())
def test_a_spliced_body_is_orjsons_writing_of_the_payload(
    first: list[Any], more: list[Any], others: dict[str, Any], later: dict[str, Any], at: int,
    later_at: int, remarked: bool,
) -> None:
    previous = SentBody()
    payload = _payload(others, at, first)
    assert written(payload, previous) == orjson.dumps(payload)
    _held(previous, first)
    # the next turn: the same message objects first (all, or all but the last: a client that
    # moved its cache marker), new ones after, other members changed
    kept = first[:-1] if remarked and len(first) > 1 else first
    head = [*kept, {**first[-1], "cache_control": {"type": "ephemeral"}}] if (
        kept is not first) else kept
    following = _payload(later, later_at, [*head, *more])
    into = SentBody()
    assert spliced(following, len(kept), previous, into) == orjson.dumps(following)
    _held(into, [*head, *more])
    # and the turn after that, from the spliced one
    third = _payload(later, later_at, [*head, *more, {"role": "user", "content": "again"}])
    last = SentBody()
    assert spliced(third, len(head) + len(more), into, last) == orjson.dumps(third)
    _held(last, [*head, *more, {"role": "user", "content": "again"}])


def test_a_body_is_not_spliced_from_other_messages() -> None:
    """Only from a previous body holding exactly `base` items (else the caller writes all)."""
    previous = SentBody()
    payload = {"model": "m", "messages": [{"role": "user", "content": "a"}]}
    assert written(payload, previous) is not None
    two = {"model": "m", "messages": [{"role": "user", "content": "a"}] * 3}
    assert spliced(two, 2, previous, SentBody()) is None  # (it holds one)
    three = SentBody()
    assert written(two, three) is not None
    assert spliced({"messages": [*two["messages"], "x"]}, 1, three, SentBody()) is None
    assert spliced(two, 1, SentBody(), SentBody()) is None  # (it holds none)
    assert spliced({"model": "m", "messages": payload["messages"]}, 1, previous,
                   SentBody()) is None  # (nothing new)
    deep: Any = "x"
    for _ in range(300):
        deep = [deep]
    assert spliced({"messages": [*payload["messages"], deep]}, 1, previous, SentBody()) is None
    assert written({"messages": [deep]}, SentBody()) is None
    # A message nested as deep as orjson writes it alone but not inside the body: refused as
    # the body is (the caller answers 400), not let through inside a Fragment.
    edge: Any = []
    for _ in range(251):
        edge = [edge]
    message = {"role": "user", "x": edge}
    assert orjson.dumps([message])
    with pytest.raises(TypeError):
        orjson.dumps({"messages": [message]})
    assert written({"messages": [message]}, SentBody()) is None
    assert spliced({"messages": [*two["messages"], message]}, 3, three, SentBody()) is None
    assert written({"model": "m"}, SentBody()) is None  # (no messages: nothing to keep)
