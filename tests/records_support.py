"""Trajectory records as the proxy writes them (docs/trajectories.md), for tests that
feed the analysis hand-made logs."""

from __future__ import annotations

from typing import Any


def episode_record(eid: str, **fields: Any) -> dict[str, Any]:
    """A schema-1 episode record: a hidden-arm failure using 5 of 10 turns, unless `fields`
    say otherwise."""
    record: dict[str, Any] = {
        "schema": 1, "type": "episode", "episode_id": eid, "task_id": "t1", "group": None,
        "tags": {}, "model": "m", "budget": 5, "max_turns": 10, "tier": "50%",
        "disclosure": "hidden", "announced_budget": None, "turns_used": 5, "outcome": "failure",
        "success_turn": None, "reward": 0.0, "exhausted": False, "end_reason": "failure",
        "started_at": "2026-11-30T10:00:00.000Z", "ended_at": "2026-11-30T10:01:00.000Z",
    }  # fmt: skip
    record.update(fields)
    return record


class BytesEntry:
    """A turn log entry (store/turn_log.py's Entry) that is its bytes, with a small form."""

    def __init__(self, data: bytes, small: bytes) -> None:
        self.data, self._small, self.encoded = data, small, 0

    @property
    def size(self) -> int:
        return len(self.data)

    def encode(self) -> bytes:
        self.encoded += 1
        return self.data

    def small(self) -> bytes:
        return self._small

    numbers = (1, 1)  # its turn and attempt
    after = None  # (whole: it follows no other entry)

    def whole(self) -> BytesEntry:
        return self
