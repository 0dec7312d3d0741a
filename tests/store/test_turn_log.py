"""The memory turn log: entries kept as they are, written out when read, within its bounds."""

from __future__ import annotations

import time

import pytest
from records_support import BytesEntry

from budgetproxy.store.turn_log import MemoryTurnLog


def _entry(i: int, pad: int = 40) -> BytesEntry:
    return BytesEntry(b'{"turn":%d,"messages":"%s"}' % (i, b"x" * pad),
                      b'{"turn":%d,"truncated":true}' % i)


async def test_entries_are_written_when_read_and_bounded_per_episode() -> None:
    log = MemoryTurnLog(60, max_episode_bytes=100, max_turns=3)
    entries = [_entry(i) for i in range(5)]
    for e in entries:
        await log.append("ep", e)
    assert [e.encoded for e in entries] == [0] * 5  # nothing written yet
    assert await log.read("ep") == [entries[0].data, b'{"turn":1,"truncated":true}',
                                    b'{"turn":2,"truncated":true}']
    assert await log.read("nope") is None


async def test_past_max_bytes_the_least_recently_written_go_first() -> None:
    log = MemoryTurnLog(60, max_bytes=200)
    for eid in ("a", "b", "c"):
        await log.append(eid, _entry(1))  # 55 bytes each
    await log.append("a", _entry(2))  # a is now the most recently written: b goes first
    assert await log.read("b") is None
    assert len(await log.read("a") or []) == 2 and len(await log.read("c") or []) == 1
    big = MemoryTurnLog(60, max_bytes=10)
    await big.append("only", _entry(1))  # past the bound alone: kept, as the last written
    assert await big.read("only") == [_entry(1).data]


async def test_retention_drops_episodes_idle_past_it(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    log = MemoryTurnLog(10)
    await log.append("old", _entry(1))
    now[0] += 6
    await log.append("new", _entry(1))
    now[0] += 5  # old is 11 s idle, new 5 s
    assert await log.read("old") is None
    await log.append("new", _entry(2))  # a write sweeps what is past retention
    assert "old" not in log._eps and log._total == len(_entry(1).data) * 2
    now[0] += 11
    await log.append("later", _entry(1))
    assert list(log._eps) == ["later"]
