"""Append-only token trajectories: the prefix rule and the one sequence with its loss mask."""

from __future__ import annotations

from budgetproxy.core.tokens import extends, last_attempts, sequence


def turn(prompt: list[int], completion: list[int], lps: list[float] | None = None) -> dict:
    return {"prompt_token_ids": prompt, "completion_token_ids": completion, "logprobs": lps}


def test_extends() -> None:
    assert extends([1, 2], [3], [1, 2, 3, 4])
    assert extends([1, 2], [3], [1, 2, 3])
    assert not extends([1, 2], [3], [1, 2, 9, 4])  # the completion was re-rendered otherwise
    assert not extends([1, 2], [3], [1, 5, 3, 4])  # an earlier message changed
    assert not extends([1, 2], [3], [1, 2])
    assert not extends(None, [3], [1, 2, 3])


def test_sequence_with_masks() -> None:
    seq = sequence([turn([1, 2], [3, 4], [-0.1, -0.2]),
                    turn([1, 2, 3, 4, 5], [6], [-0.3])])
    assert seq is not None
    assert seq.token_ids == [1, 2, 3, 4, 5, 6]
    assert seq.loss_mask == [0, 0, 1, 1, 0, 1]
    assert seq.logprobs == [None, None, -0.1, -0.2, None, -0.3]


def test_no_sequence_when_a_turn_does_not_extend() -> None:
    assert sequence([turn([1, 2], [3]), turn([1, 9, 3], [4])]) is None
    assert sequence([turn([1], [2]), {"prompt_token_ids": None}]) is None
    assert sequence([]) is None


def test_a_trajectory_keeps_each_turns_highest_attempt_in_turn_order() -> None:
    """Whatever order the entries were logged in: per turn its highest attempt (the one the
    agent went on from), and of two with the same attempt the later."""
    logged = [{"turn": 2, "attempt": 2, "id": "a"}, {"turn": 1, "attempt": 1, "id": "b"},
              {"turn": 2, "attempt": 1, "id": "c"}, {"turn": 1, "attempt": 1, "id": "d"},
              {"turn": 3, "id": "e"}]
    assert [t["id"] for t in last_attempts(logged)] == ["d", "a", "e"]
    assert last_attempts([]) == []
