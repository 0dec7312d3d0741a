"""A kept turn that holds only what follows an earlier turn's messages is read whole."""

from __future__ import annotations

from typing import Any

from budgetproxy.store.turn_log import expand


def entry(turn: int, messages: list[Any] | None, after: list[int] | None = None,
          attempt: int = 1) -> dict[str, Any]:
    e: dict[str, Any] = {"turn": turn, "attempt": attempt, "messages": messages}
    if after is not None:
        e["messages_after"] = after
    return e


def test_each_entry_is_given_the_messages_it_follows() -> None:
    got = expand([entry(1, ["a"]), entry(2, ["b", "c"], [1, 1, 1]),
                  entry(3, ["d"], [2, 1, 2])])
    assert [e["messages"] for e in got] == [["a"], ["a", "b", "c"], ["a", "b", "d"]]
    assert all("messages_after" not in e and "truncated" not in e for e in got)


def test_in_any_order_and_after_a_retry() -> None:
    """An entry read before the one it follows (two replicas' writes), and one following a
    turn's second attempt."""
    got = expand([entry(3, ["z"], [2, 2, 1]), entry(1, ["a"]), entry(2, ["x"], [1, 1, 1]),
                  entry(2, ["y"], [1, 1, 1], attempt=2)])
    assert [e["messages"] for e in got] == [["a", "z"], ["a"], ["a", "x"], ["a", "y"]]


def test_without_the_entry_it_follows_it_is_truncated() -> None:
    got = expand([entry(2, ["b"], [1, 1, 1]), entry(4, ["d"], [3, 1, 1]),
                  entry(6, ["f"], "junk"), entry(7, ["g"], [8, 1, 3]),  # type: ignore[arg-type]
                  entry(8, ["h"])])  # (7 follows more messages than 8 has)
    assert got.pop()["messages"] == ["h"]
    for e in got:
        assert e["messages"] is None and e["truncated"] is True and "messages_after" not in e


def test_a_small_entry_has_no_messages_to_follow() -> None:
    """An entry kept without its messages (past the episode's byte bound) leaves those after
    it truncated too, not wrong."""
    got = expand([entry(1, ["a"]), {"turn": 2, "attempt": 1, "messages": None,
                                    "truncated": True}, entry(3, ["c"], [2, 1, 1])])
    assert got[0]["messages"] == ["a"]
    assert got[2]["messages"] is None and got[2]["truncated"] is True
