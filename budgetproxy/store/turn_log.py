"""Each episode's turns as the model saw them, kept for GET /v1/episodes/{id}/trajectory.

An entry is one answered turn, read as JSON bytes. Bounded: at most `max_turns` entries and
`max_episode_bytes` per episode (later turns are kept without their messages, marked
`truncated`), `retention_s` after an episode's last turn, and in memory at most `max_bytes`
in all (the episodes written least recently are dropped first). In memory an entry is kept
as the bytes it is made of (proxy/grouping.py: the request body the upstream got, and the
turn's other fields) and written out when it is read; its size is theirs. Redis keeps
``{prefix}:turns:{<id>}``, a list of the entries' JSON expiring `retention_s` after its last
write.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Any, Protocol

from budgetproxy.store.base import StoreUnavailable

MAX_TURNS = 1024
MAX_EPISODE_BYTES = 16 * 1024 * 1024
MAX_BYTES = 256 * 1024 * 1024


class Entry(Protocol):
    """One turn to keep: its JSON, made when it is asked for."""

    @property
    def size(self) -> int:
        """The bytes it keeps while in memory (what the byte bounds count)."""
        ...

    def encode(self) -> bytes:
        """The turn's JSON (its small form when its messages cannot be written)."""
        ...

    def small(self) -> bytes:
        """The turn's JSON without its messages, marked truncated."""
        ...


class TurnLog(Protocol):
    async def append(self, episode_id: str, entry: Entry) -> None:
        """Keep `entry`, or its small form when the episode is past its byte bound."""
        ...

    async def read(self, episode_id: str) -> list[bytes] | None: ...

    async def close(self) -> None: ...


class _Kept:
    __slots__ = ("entries", "size", "at")

    def __init__(self) -> None:
        self.entries: list[Entry | bytes] = []  # bytes: a small form
        self.size = 0
        self.at = 0.0


class MemoryTurnLog:
    def __init__(self, retention_s: float, max_bytes: int = MAX_BYTES,
                 max_episode_bytes: int = MAX_EPISODE_BYTES, max_turns: int = MAX_TURNS) -> None:
        self._eps: OrderedDict[str, _Kept] = OrderedDict()  # least recently written first
        self._retention = retention_s
        self._max_bytes = max_bytes
        self._max_episode = max_episode_bytes
        self._max_turns = max_turns
        self._total = 0
        # When the least recently written episode is past retention at the earliest: no
        # sweep before then (its `at` only grows, and any other is later).
        self._expires = float("inf")

    async def append(self, episode_id: str, entry: Entry) -> None:
        now = time.monotonic()
        eps = self._eps
        kept = eps.get(episode_id)
        if kept is None:
            kept = eps[episode_id] = _Kept()
            if len(eps) == 1:
                self._expires = now + self._retention
        else:
            eps.move_to_end(episode_id)  # now the most recently written
        if len(kept.entries) < self._max_turns:
            size = entry.size
            if kept.size + size <= self._max_episode:
                kept.entries.append(entry)
            else:
                small = entry.small()
                size = len(small)
                kept.entries.append(small)
            kept.size += size
            self._total += size
        kept.at = now
        if self._total > self._max_bytes or now >= self._expires:
            self._evict(episode_id, now)

    def _evict(self, episode_id: str, now: float) -> None:
        eps = self._eps
        while eps:
            eid, oldest = next(iter(eps.items()))
            fresh = now - oldest.at < self._retention
            if fresh and (self._total <= self._max_bytes
                          or (eid == episode_id and len(eps) == 1)):
                self._expires = oldest.at + self._retention
                return
            eps.popitem(last=False)
            self._total -= oldest.size
        self._expires = float("inf")

    async def read(self, episode_id: str) -> list[bytes] | None:
        kept = self._eps.get(episode_id)
        if kept is None or time.monotonic() - kept.at >= self._retention:
            return None
        return [e if isinstance(e, bytes) else e.encode()
                for e in kept.entries]

    async def close(self) -> None:
        return None


class RedisTurnLog:
    def __init__(self, url: str, prefix: str, retention_s: float,
                 max_episode_bytes: int = MAX_EPISODE_BYTES, max_turns: int = MAX_TURNS) -> None:
        import redis.asyncio as aioredis

        self._redis: Any = aioredis.Redis.from_url(url, socket_timeout=5.0,
                                                   socket_connect_timeout=5.0)
        self._prefix = prefix
        self._ttl = max(1, int(retention_s))
        self._max_episode = max_episode_bytes
        self._max_turns = max_turns

    async def _run(self, coro: Any) -> Any:
        from redis import exceptions as rexc

        try:
            return await coro
        except (rexc.ConnectionError, rexc.TimeoutError, OSError) as e:
            raise StoreUnavailable(f"Redis is unavailable: {e}") from e

    def _key(self, episode_id: str) -> tuple[str, str]:
        base = f"{self._prefix}:turns:{{{episode_id}}}"
        return base, base + ":bytes"

    async def append(self, episode_id: str, turn: Entry) -> None:
        key, size_key = self._key(episode_id)
        entry, small = turn.encode(), turn.small
        # One round trip as a rule: the entry goes in, and is swapped for its small form only
        # when the episode's bytes turn out to be past the bound.
        pipe = self._redis.pipeline(transaction=True)
        pipe.rpush(key, entry).ltrim(key, 0, self._max_turns - 1).expire(key, self._ttl)
        pipe.incrby(size_key, len(entry)).expire(size_key, self._ttl)
        length, _, _, size, _ = await self._run(pipe.execute())
        if size > self._max_episode and length <= self._max_turns:
            data = small()
            pipe = self._redis.pipeline(transaction=True)
            pipe.lset(key, length - 1, data).incrby(size_key, len(data) - len(entry))
            await self._run(pipe.execute())

    async def read(self, episode_id: str) -> list[bytes] | None:
        entries = await self._run(self._redis.lrange(self._key(episode_id)[0], 0, -1))
        return list(entries) if entries else None

    async def close(self) -> None:
        await self._redis.aclose()
