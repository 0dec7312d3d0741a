"""Each episode's turns as the model saw them, kept for GET /v1/episodes/{id}/trajectory.

An entry is one answered turn, read as JSON bytes. Bounded: at most `max_turns` entries and
`max_episode_bytes` per episode (later turns are kept without their messages, marked
`truncated`), `retention_s` after an episode's last turn, and in memory at most `max_bytes`
in all (the episodes written least recently are dropped first). In memory an entry is kept
as the bytes it is made of (proxy/grouping.py: the request body the upstream got, and the
turn's other fields) and written out when it is read; its size is theirs. Redis keeps
``{prefix}:turns:{<id>}``, a list of the entries' JSON expiring `retention_s` after its last
write.

A turn whose conversation extends the previous turn's, as the upstream got both, is kept as
its new messages with `"messages_after": [turn, attempt, n]` (proxy/grouping.py): `expand`
puts the first n messages of that entry before them when the turns are read, so an episode's
entries grow with its turns, not with their square.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from importlib import resources
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from budgetproxy.store.redis import RedisStore

log = logging.getLogger("budgetproxy")

MAX_TURNS = 1024
MAX_EPISODE_BYTES = 16 * 1024 * 1024
MAX_BYTES = 256 * 1024 * 1024


class Entry(Protocol):
    """One turn to keep: its JSON, made when it is asked for."""

    @property
    def size(self) -> int:
        """The bytes it keeps while in memory (what the byte bounds count)."""
        ...

    @property
    def numbers(self) -> tuple[int, int]:
        """Its turn and attempt."""
        ...

    @property
    def after(self) -> tuple[int, int, int] | None:
        """(turn, attempt, n) of the entry whose first n messages come before its own (its
        messages are only what follows them); None when it holds them whole."""
        ...

    def whole(self) -> Entry:
        """The entry holding its messages whole (itself when it does)."""
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


def expand(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Entries as read, each with its whole `messages`. An entry kept as what follows an
    earlier turn's messages (`"messages_after": [turn, attempt, n]`, proxy/grouping.py) gets
    that turn's first n messages put before its own; when that turn's messages are not
    there (past a bound, or never written), it is given as truncated, without messages."""
    known: dict[tuple[Any, Any], list[Any]] = {}
    waiting: list[dict[str, Any]] = []
    for e in entries:
        if "messages_after" in e:
            waiting.append(e)
        elif isinstance(e.get("messages"), list):
            known[(e.get("turn"), e.get("attempt"))] = e["messages"]
    while waiting:  # (an entry may follow one that follows another)
        later = []
        for e in waiting:
            after = e["messages_after"]
            base = known.get((after[0], after[1])) if isinstance(after, list) and len(
                after) == 3 else None
            if base is None:
                later.append(e)
                continue
            del e["messages_after"]
            own = e.get("messages")
            if isinstance(own, list) and isinstance(after[2], int) and 0 <= after[2] <= len(
                    base):
                e["messages"] = base[: after[2]] + own
                known[(e.get("turn"), e.get("attempt"))] = e["messages"]
            else:
                e["messages"], e["truncated"] = None, True
        if len(later) == len(waiting):  # nothing more can be put together
            for e in later:
                del e["messages_after"]
                e["messages"], e["truncated"] = None, True
            break
        waiting = later
    return entries


class _Kept:
    __slots__ = ("entries", "size", "at", "tip")

    def __init__(self) -> None:
        self.entries: list[Entry | bytes] = []  # bytes: a small form
        self.size = 0
        self.at = 0.0
        self.tip: tuple[int, int] | None = None  # the last entry kept with its messages


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
        # (an entry kept as what follows another is made only while that one is the tip:
        # proxy/grouping.py asks `tip` first)
        kept.tip = None
        if len(kept.entries) < self._max_turns:
            size = entry.size
            if kept.size + size <= self._max_episode:
                kept.entries.append(entry)
                kept.tip = entry.numbers
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

    def tip(self, episode_id: str) -> tuple[int, int] | None:
        """(turn, attempt) of the episode's last entry kept with its messages: the one a next
        entry may follow (None: none, or the episode is no longer kept)."""
        kept = self._eps.get(episode_id)
        return None if kept is None else kept.tip

    async def read(self, episode_id: str) -> list[bytes] | None:
        kept = self._eps.get(episode_id)
        if kept is None or time.monotonic() - kept.at >= self._retention:
            return None
        return [e if isinstance(e, bytes) else e.encode()
                for e in kept.entries]

    async def close(self) -> None:
        return None


class RedisTurnLog:
    """The turns in the episode store's Redis, written through its batched scripts: an
    append rides in the same write as the turn's settle, and the caller does not wait for it
    (a failure is logged). A read waits for this process's appends to that episode."""

    def __init__(self, store: RedisStore, retention_s: float,
                 max_episode_bytes: int = MAX_EPISODE_BYTES, max_turns: int = MAX_TURNS) -> None:
        self._store = store
        self._prefix = store.prefix
        self._ttl = max(1, int(retention_s))
        self._max_episode = max_episode_bytes
        self._max_turns = max_turns
        self._append = store.register(_lua("turn_append.lua"))
        self._swap = store.register(_SWAP)
        self._read = store.register(_READ)
        self._pending: dict[str, asyncio.Future[Any]] = {}  # each episode's last append

    def _key(self, episode_id: str) -> list[str]:
        base = f"{self._prefix}:turns:{{{episode_id}}}"
        return [base, base + ":bytes", base + ":tip"]

    async def append(self, episode_id: str, turn: Entry) -> None:
        self._send(episode_id, self._key(episode_id), turn)

    def _send(self, episode_id: str, keys: list[str], turn: Entry) -> None:
        entry = turn.encode()
        after = turn.after
        fut = self._store.submit(self._append, keys, [
            entry, self._max_turns, self._ttl, self._max_episode, _turn_id(turn.numbers),
            "" if after is None else _turn_id(after[:2])])
        self._pending[episode_id] = fut
        fut.add_done_callback(lambda f: self._appended(episode_id, keys, turn, entry, f))

    def _appended(self, episode_id: str, keys: list[str], turn: Entry, entry: bytes,
                  fut: asyncio.Future[Any]) -> None:
        if self._pending.get(episode_id) is fut:
            del self._pending[episode_id]
        reply = _outcome(fut)
        if isinstance(reply, BaseException):
            log.warning("store unavailable: a turn of %s not kept for its trajectory (%s)",
                        episode_id, reply)
            return
        # (a turn kept as what follows another holds its whole form until Redis has it)
        if reply == -1:  # what it follows is not there: sent whole
            whole = turn.whole()
            if whole is not turn:  # (an entry always has its whole form: never sent again)
                self._send(episode_id, keys, whole)
            return
        if reply:  # past the episode's byte bound: the turn without its messages
            data = turn.small()
            swap = self._store.submit(self._swap, keys, [reply - 1, data, len(data) - len(entry)])
            self._pending[episode_id] = swap
            swap.add_done_callback(lambda f: self._swapped(episode_id, f))

    def _swapped(self, episode_id: str, fut: asyncio.Future[Any]) -> None:
        if self._pending.get(episode_id) is fut:
            del self._pending[episode_id]
        failed = _outcome(fut)
        if isinstance(failed, BaseException):
            log.warning("store unavailable: a turn of %s kept with its messages past the "
                        "episode's byte bound (%s)", episode_id, failed)

    async def read(self, episode_id: str) -> list[bytes] | None:
        pending = self._pending.get(episode_id)
        while pending is not None:  # this process's appends first (a swap may follow one)
            await asyncio.shield(pending)
            await asyncio.sleep(0)  # its callback runs
            pending = self._pending.get(episode_id)
        entries = await self._store.run(self._read, self._key(episode_id)[:1], [])
        return [e if type(e) is bytes else e.encode() for e in entries] if entries else None

    async def close(self) -> None:
        return None  # the store is the app's; its close sends what is pending


# The turn at a position swapped for its small form. KEYS: list, byte count.
# ARGV: index (0-based), data, byte difference.
_SWAP = """
redis.call('LSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('INCRBY', KEYS[2], ARGV[3])
return 1
"""  # (KEYS: list, byte count; the append left no tip behind a turn it returns for)

_READ = "return redis.call('LRANGE', KEYS[1], 0, -1)"


def _turn_id(numbers: tuple[int, ...]) -> str:
    """An entry's (turn, attempt) as the tip key holds it."""
    return f"{numbers[0]}:{numbers[1]}"


def _outcome(fut: asyncio.Future[Any]) -> Any:
    """A submitted script's reply, or the error it failed with (returned, not raised)."""
    if fut.cancelled():
        return asyncio.CancelledError()
    return fut.exception() or fut.result()


def _lua(name: str) -> str:
    return resources.files("budgetproxy.store").joinpath(name).read_text(encoding="utf-8")
