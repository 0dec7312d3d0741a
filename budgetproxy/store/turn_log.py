"""Each episode's turns as the model saw them, kept for GET /v1/episodes/{id}/trajectory.

Entries are JSON bytes, one per answered turn. Bounded: at most `max_turns` entries and
`max_episode_bytes` per episode (later turns are kept without their messages, marked
`truncated`), `retention_s` after an episode's last turn, and in memory at most `max_bytes`
in all (the episodes written least recently are dropped first). Redis keeps
``{prefix}:turns:{<id>}``, a list expiring `retention_s` after its last write.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Protocol

from budgetproxy.store.base import StoreUnavailable

MAX_TURNS = 1024
MAX_EPISODE_BYTES = 16 * 1024 * 1024
MAX_BYTES = 256 * 1024 * 1024


class TurnLog(Protocol):
    async def append(self, episode_id: str, entry: bytes, small: Callable[[], bytes]) -> None:
        """Keep `entry`, or `small()` (the entry without its messages) when the episode is
        past its byte bound."""
        ...

    async def read(self, episode_id: str) -> list[bytes] | None: ...

    async def close(self) -> None: ...


class _Kept:
    __slots__ = ("entries", "size", "at")

    def __init__(self) -> None:
        self.entries: list[bytes] = []
        self.size = 0
        self.at = 0.0


class MemoryTurnLog:
    def __init__(self, retention_s: float, max_bytes: int = MAX_BYTES,
                 max_episode_bytes: int = MAX_EPISODE_BYTES, max_turns: int = MAX_TURNS) -> None:
        self._eps: OrderedDict[str, _Kept] = OrderedDict()
        self._retention = retention_s
        self._max_bytes = max_bytes
        self._max_episode = max_episode_bytes
        self._max_turns = max_turns
        self._total = 0

    async def append(self, episode_id: str, entry: bytes, small: Callable[[], bytes]) -> None:
        now = time.monotonic()
        kept = self._eps.pop(episode_id, None) or _Kept()
        self._eps[episode_id] = kept  # now the most recently written
        if len(kept.entries) < self._max_turns:
            data = entry if kept.size + len(entry) <= self._max_episode else small()
            kept.entries.append(data)
            kept.size += len(data)
            self._total += len(data)
        kept.at = now
        eps = self._eps
        while eps:
            eid, oldest = next(iter(eps.items()))
            if self._total <= self._max_bytes and now - oldest.at < self._retention:
                break
            if eid == episode_id and len(eps) == 1 and now - oldest.at < self._retention:
                break
            eps.popitem(last=False)
            self._total -= oldest.size

    async def read(self, episode_id: str) -> list[bytes] | None:
        kept = self._eps.get(episode_id)
        if kept is None or time.monotonic() - kept.at >= self._retention:
            return None
        return list(kept.entries)

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

    async def append(self, episode_id: str, entry: bytes, small: Callable[[], bytes]) -> None:
        key, size_key = self._key(episode_id)
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
