"""Groups of episodes (task_id, group): declared size, members, and a wake-up when one ends.

Memory: dicts in this process, at most `MAX_GROUPS` (oldest dropped first). Redis, shared by
replicas: ``{prefix}:grp:{<task>\\0<group>}`` a hash (`size`) and ``...:m`` a list of episode
ids, both expiring `retention_s` after the last change; an episode's end is published on
``{prefix}:grp-ended:<task>\\0<group>`` so a long poll on any replica wakes at once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from typing import Any, Protocol

from budgetproxy.store.base import StoreUnavailable

GroupKey = tuple[str, str]  # (task_id, group)
MAX_GROUPS = 100_000
MAX_MEMBERS = 10_000  # per group: a group is a GRPO group or a K-sample set, not a log


class GroupStore(Protocol):
    async def declare(self, key: GroupKey, size: int) -> int:
        """Set the group's size unless it has one; the size in force."""
        ...

    async def join(self, key: GroupKey, episode_id: str) -> None: ...

    async def members(self, key: GroupKey) -> tuple[int | None, list[str]]:
        """The declared size (None: never declared) and episode ids in joining order."""
        ...

    async def ended(self, key: GroupKey) -> None:
        """One of the group's episodes ended: wake its waiters (on every replica)."""
        ...

    async def wait(self, key: GroupKey, timeout: float) -> None:
        """Return when one of the group's episodes ends, or after `timeout` seconds."""
        ...

    async def close(self) -> None: ...


class _Group:
    __slots__ = ("size", "members", "event")

    def __init__(self) -> None:
        self.size: int | None = None
        self.members: list[str] = []
        self.event = asyncio.Event()


class MemoryGroups:
    """Groups of one process."""

    def __init__(self, max_groups: int = MAX_GROUPS) -> None:
        self._groups: OrderedDict[GroupKey, _Group] = OrderedDict()
        self._max = max_groups

    def _get(self, key: GroupKey) -> _Group:
        g = self._groups.get(key)
        if g is None:
            g = self._groups[key] = _Group()
            while len(self._groups) > self._max:
                self._groups.popitem(last=False)
        return g

    async def declare(self, key: GroupKey, size: int) -> int:
        g = self._get(key)
        if g.size is None:
            g.size = size
        return g.size

    async def join(self, key: GroupKey, episode_id: str) -> None:
        g = self._get(key)
        if episode_id not in g.members and len(g.members) < MAX_MEMBERS:
            g.members.append(episode_id)

    async def members(self, key: GroupKey) -> tuple[int | None, list[str]]:
        g = self._groups.get(key)
        return (None, []) if g is None else (g.size, list(g.members))

    async def ended(self, key: GroupKey) -> None:
        g = self._groups.get(key)
        if g is not None:
            g.event.set()
            g.event = asyncio.Event()

    async def wait(self, key: GroupKey, timeout: float) -> None:
        event = self._get(key).event
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout)

    async def close(self) -> None:
        return None


class RedisGroups:
    """Groups shared by replicas on one Redis."""

    def __init__(self, url: str, prefix: str, retention_s: float,
                 max_connections: int = 64) -> None:
        import redis.asyncio as aioredis

        # A burst waits for a pooled connection instead of failing at the pool's limit.
        pool = aioredis.BlockingConnectionPool.from_url(
            url, max_connections=max_connections, timeout=5.0, socket_timeout=5.0,
            socket_connect_timeout=5.0)
        self._redis: Any = aioredis.Redis(connection_pool=pool)
        self._prefix = prefix
        self._ttl = max(60, int(retention_s))
        # Long polls share one subscription per process (to every group's end channel),
        # however many wait: a connection each would take thousands of them.
        self._waiters: dict[bytes, set[asyncio.Future[None]]] = {}
        self._listener: asyncio.Task[None] | None = None

    def _keys(self, key: GroupKey) -> tuple[str, str, str]:
        name = f"{key[0]}\0{key[1]}"
        base = f"{self._prefix}:grp:{{{name}}}"
        return base, base + ":m", f"{self._prefix}:grp-ended:{name}"

    async def _run(self, coro: Any) -> Any:
        from redis import exceptions as rexc

        try:
            return await coro
        except (rexc.ConnectionError, rexc.TimeoutError, OSError) as e:
            raise StoreUnavailable(f"Redis is unavailable: {e}") from e

    async def declare(self, key: GroupKey, size: int) -> int:
        h, m, _ = self._keys(key)
        pipe = self._redis.pipeline(transaction=True)
        pipe.hsetnx(h, "size", size).hget(h, "size").expire(h, self._ttl)
        _, current, _ = await self._run(pipe.execute())
        return int(current)

    async def join(self, key: GroupKey, episode_id: str) -> None:
        h, m, _ = self._keys(key)
        pipe = self._redis.pipeline(transaction=True)
        pipe.rpush(m, episode_id).ltrim(m, 0, MAX_MEMBERS - 1).expire(m, self._ttl)
        pipe.expire(h, self._ttl)
        await self._run(pipe.execute())

    async def members(self, key: GroupKey) -> tuple[int | None, list[str]]:
        h, m, _ = self._keys(key)
        pipe = self._redis.pipeline(transaction=False)
        pipe.hget(h, "size").lrange(m, 0, -1)
        size, ids = await self._run(pipe.execute())
        seen = list(dict.fromkeys(i.decode() for i in ids))  # a retried join adds no one
        return (int(size) if size is not None else None), seen

    async def ended(self, key: GroupKey) -> None:
        await self._run(self._redis.publish(self._keys(key)[2], b"1"))

    async def wait(self, key: GroupKey, timeout: float) -> None:
        """Until an episode of the group ends (on any replica) or `timeout`; a lost
        subscription only makes the caller's next look come at its timeout."""
        if self._listener is None or self._listener.done():
            self._listener = asyncio.ensure_future(self._listen())
        channel = self._keys(key)[2].encode()
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(channel, set()).add(fut)
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(fut, timeout)
        finally:
            waiting = self._waiters.get(channel)
            if waiting is not None:
                waiting.discard(fut)
                if not waiting:
                    del self._waiters[channel]

    async def _listen(self) -> None:
        """The one subscription: wakes the waiters of each group whose end is published."""
        pattern = f"{self._prefix}:grp-ended:*"
        while self._waiters or self._listener is None:
            pubsub = self._redis.pubsub()
            try:
                await pubsub.psubscribe(pattern)
                while self._waiters:
                    msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                    if msg is None:
                        continue
                    for fut in self._waiters.get(msg["channel"], ()):
                        if not fut.done():
                            fut.set_result(None)
            except Exception:  # Redis away: waiters fall back on their timeouts
                await asyncio.sleep(1.0)
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()

    async def close(self) -> None:
        if self._listener is not None:
            self._listener.cancel()
            with contextlib.suppress(BaseException):
                await self._listener
        await self._redis.aclose()
