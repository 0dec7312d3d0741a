"""Experiments' running state: units' arms, each finished episode's outcome, the stop.

Memory: dicts and lists in this process. Redis, shared by replicas: ``{prefix}:exp:{<name>}`` a
list of finished episodes (JSON, in the order they were added; each replica reads only what it
has not read before), ``...:stop`` the decision that stopped it (set once, by whichever replica
decided first), ``...:n`` the count of new units per stratum and ``...:units`` the arm of each
task or group. None expires: an experiment's state lives as long as its name is in use (delete
the keys and restart the replicas to start it afresh).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

import orjson

from budgetproxy.core.experiment import Finished
from budgetproxy.core.sequential import Decision
from budgetproxy.store.base import StoreUnavailable

# Per experiment, in memory: past it the oldest outcomes are dropped (an experiment that long
# has decided long ago; the log keeps every episode for `analyze`).
MAX_FINISHED = 1_000_000


class ExperimentStore(Protocol):
    async def assign(self, name: str, stratum: str, unit: str | None,
                     arm_of: Callable[[int], int]) -> int:
        """The arm of a new unit: `unit`'s arm if it has one; else `arm_of(n)` for the
        stratum's n-th new unit (from 0), kept for `unit` when given. Atomic per unit across
        replicas (a race between two first episodes of one unit may skip a count)."""
        ...

    async def add(self, name: str, finished: Finished) -> None:
        """One episode of the experiment ended (called once per episode across replicas)."""
        ...

    async def finished(self, name: str) -> list[Finished]: ...

    async def stop(self, name: str, decision: Decision) -> bool:
        """Record the decision that stops the experiment; True for the one call that did."""
        ...

    async def stopped(self, name: str) -> Decision | None: ...

    async def close(self) -> None: ...


class MemoryExperiments:
    """Experiments of one process."""

    def __init__(self, max_finished: int = MAX_FINISHED) -> None:
        self._finished: dict[str, list[Finished]] = {}
        self._stops: dict[str, Decision] = {}
        self._max = max_finished
        self._counts: dict[tuple[str, str], int] = {}
        self._units: dict[tuple[str, str], int] = {}

    async def assign(self, name: str, stratum: str, unit: str | None,
                     arm_of: Callable[[int], int]) -> int:
        if unit is not None and (name, unit) in self._units:
            return self._units[name, unit]
        n = self._counts.get((name, stratum), 0)
        self._counts[name, stratum] = n + 1
        arm = arm_of(n)
        if unit is not None:
            self._units[name, unit] = arm
        return arm

    async def add(self, name: str, finished: Finished) -> None:
        kept = self._finished.setdefault(name, [])
        kept.append(finished)
        if len(kept) > self._max:
            del kept[: len(kept) - self._max]

    async def finished(self, name: str) -> list[Finished]:
        return list(self._finished.get(name, ()))

    async def stop(self, name: str, decision: Decision) -> bool:
        if name in self._stops:
            return False
        self._stops[name] = decision
        return True

    async def stopped(self, name: str) -> Decision | None:
        return self._stops.get(name)

    async def close(self) -> None:
        return None


class RedisExperiments:
    """Experiments shared by replicas on one Redis (both keys of one in one cluster slot)."""

    def __init__(self, url: str, prefix: str) -> None:
        import redis.asyncio as aioredis

        self._redis: Any = aioredis.Redis.from_url(url, socket_timeout=5.0,
                                                   socket_connect_timeout=5.0,
                                                   decode_responses=True)
        self._prefix = prefix
        # The list only grows (RPUSH): what this replica has read of it, to read only the rest.
        self._read: dict[str, list[Finished]] = {}
        # One read at a time: two that started from the same length would add the same
        # entries twice (a sweep's review and an API read run concurrently).
        self._reading = asyncio.Lock()

    def _key(self, name: str) -> str:
        return f"{self._prefix}:exp:{{{name}}}"

    async def _run(self, coro: Any) -> Any:
        from redis import exceptions as rexc

        try:
            return await coro
        except (rexc.ConnectionError, rexc.TimeoutError, OSError) as e:
            raise StoreUnavailable(f"Redis is unavailable: {e}") from e

    async def assign(self, name: str, stratum: str, unit: str | None,
                     arm_of: Callable[[int], int]) -> int:
        units, counts = self._key(name) + ":units", self._key(name) + ":n"
        if unit is not None:
            kept = await self._run(self._redis.hget(units, unit))
            if kept is not None:
                return int(kept)
        n = int(await self._run(self._redis.hincrby(counts, stratum, 1))) - 1
        arm = arm_of(n)
        if unit is not None and not await self._run(self._redis.hsetnx(units, unit, arm)):
            return int(await self._run(self._redis.hget(units, unit)))  # another was first
        return arm

    async def add(self, name: str, finished: Finished) -> None:
        await self._run(self._redis.rpush(self._key(name), orjson.dumps(finished.to_json())))

    async def finished(self, name: str) -> list[Finished]:
        async with self._reading:
            kept = self._read.setdefault(name, [])
            pipe = self._redis.pipeline(transaction=True)
            pipe.llen(self._key(name)).lrange(self._key(name), len(kept), -1)
            length, raw = await self._run(pipe.execute())
            if length < len(kept):  # the keys were deleted (the experiment started afresh)
                kept.clear()
                raw = await self._run(self._redis.lrange(self._key(name), 0, -1))
            kept.extend(Finished.from_json(orjson.loads(r)) for r in raw)
            return list(kept)

    async def stop(self, name: str, decision: Decision) -> bool:
        return bool(await self._run(self._redis.set(self._key(name) + ":stop", decision,
                                                    nx=True)))

    async def stopped(self, name: str) -> Decision | None:
        value = await self._run(self._redis.get(self._key(name) + ":stop"))
        return value  # type: ignore[no-any-return]

    async def close(self) -> None:
        await self._redis.aclose()
