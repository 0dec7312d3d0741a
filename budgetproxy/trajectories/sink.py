"""Trajectory sink: JSONL records written off the request path by one writer task.

A record is encoded as it is put (once its call has answered, while what it holds is still in
the CPU's caches) and waits as its line. Back-pressure: the queue is bounded; when it is full,
`put` waits, so calls slow down instead of records being dropped. After a quiet spell a line
is written and flushed to the OS at once, by its `put`; lines that come within the flush
interval (`linger`, `trajectories.flush_interval_s`) of the previous write wait for the writer,
which takes them all at once when it has passed (or the queue is full, or the sink closes) and
writes them as one batch (small batches inline, large ones and rotations from a thread): a
file write that is the first in milliseconds costs a call more than the rest of its record
(bench/README.md). A SIGKILL loses only what was still queued (at most a flush interval's
records), never a written line. SIGTERM drains the queue before the process exits.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import gzip
import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any, Protocol

import orjson

_INLINE_MAX_RECORDS = 256
_BATCH_MAX = 4096  # records encoded in one go on the event loop, at most
_line = functools.partial(orjson.dumps, option=orjson.OPT_APPEND_NEWLINE)

log = logging.getLogger("budgetproxy.trajectories.sink")


def _plain(value: Any) -> Any:
    """What the standard library writes for a value it does not know: an orjson.Fragment
    (JSON text kept as it came, such as captured logprobs) as what it holds, else its str."""
    if isinstance(value, orjson.Fragment):
        return orjson.loads(orjson.dumps(value))
    return str(value)


def record_line(record: dict[str, Any]) -> bytes:
    """One JSONL line for a record, whatever the agent put in it.

    orjson refuses integers over 64 bits and nesting deeper than 254 levels, both of which an
    agent's request (or an outcome's metadata) can carry; the standard library writes those.
    What neither can write keeps the record's scalar fields, so every turn still has its line,
    and names what was left out under "unencodable"."""
    try:
        return orjson.dumps(record) + b"\n"
    except (TypeError, ValueError):
        pass
    try:
        text = json.dumps(record, ensure_ascii=False, allow_nan=False, default=_plain,
                          separators=(",", ":"))
        return text.encode() + b"\n"
    except (TypeError, ValueError, RecursionError):
        pass
    kept: dict[str, Any] = {k: v for k, v in record.items()
                            if v is None or isinstance(v, str | bool | float)
                            or (isinstance(v, int) and -(1 << 63) <= v < 1 << 63)}
    kept["unencodable"] = sorted(set(record) - set(kept))
    try:
        return orjson.dumps(kept) + b"\n"
    except (TypeError, ValueError):  # a str with lone surrogates, say
        kept = {k: v for k, v in kept.items() if not isinstance(v, str) and k != "unencodable"}
        kept["unencodable"] = sorted(set(record) - set(kept))
        return orjson.dumps(kept) + b"\n"


class TrajectorySink(Protocol):
    async def start(self) -> None: ...

    async def put(self, record: dict[str, Any]) -> None: ...

    async def close(self) -> None: ...

    def depth(self) -> int: ...


class NullSink:
    """Drops records (trajectories disabled)."""

    async def start(self) -> None:
        return None

    async def put(self, record: dict[str, Any]) -> None:
        return None

    async def close(self) -> None:
        return None

    def depth(self) -> int:
        return 0


class MemorySink:
    """Keeps records in a list (tests and embedding)."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    async def start(self) -> None:
        return None

    async def put(self, record: dict[str, Any]) -> None:
        self.records.append(record)

    async def close(self) -> None:
        return None

    def depth(self) -> int:
        return 0


class JsonlSink:
    """Appends records to `<dir>/trajectories-<start>-<pid>.jsonl`, rotating by size."""

    def __init__(
        self,
        directory: str | Path,
        *,
        max_file_bytes: int,
        gzip_rotated: bool,
        queue_size: int,
        linger_s: float = 0.2,
    ) -> None:
        self._linger = linger_s
        self._dir = Path(directory)
        self._max_bytes = max_file_bytes
        self._gzip = gzip_rotated
        # The queue: lines wait in a list the writer takes whole, so a call's `put` is an
        # append, and a batch costs no step per record.
        self._records: list[bytes] = []
        self._max_queued = queue_size
        self._wake: asyncio.Future[None] | None = None  # the writer, waiting for a record
        # the writer, waiting for the flush interval to pass (cut short when the queue fills)
        self._lingering: asyncio.Future[None] | None = None
        self._space: collections.deque[asyncio.Future[None]] = collections.deque()  # callers
        self._putting = 0  # callers waiting for room: the writer lets each in before it ends
        self._closing = False
        self._task: asyncio.Task[None] | None = None
        self._file: Any = None
        self._path: Path | None = None
        self._written = 0
        self._seq = 0
        self._last_write = float("-inf")  # (the loop's clock)

    @property
    def path(self) -> Path | None:
        return self._path

    async def start(self) -> None:
        self._dir.mkdir(parents=True, exist_ok=True)
        self._open_new()
        self._task = asyncio.create_task(self._run(), name="trajectory-writer")

    def _open_new(self) -> None:
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        self._seq += 1
        self._path = self._dir / f"trajectories-{stamp}-{os.getpid()}-{self._seq:04d}.jsonl"
        self._file = open(self._path, "ab")  # noqa: SIM115 - lives as long as the sink
        self._written = 0

    def _rotate(self) -> None:
        old = self._path
        self._file.close()
        self._open_new()
        if self._gzip and old is not None:
            with open(old, "rb") as src, gzip.open(f"{old}.gz", "wb") as dst:
                shutil.copyfileobj(src, dst)
            old.unlink()

    def depth(self) -> int:
        return len(self._records)

    async def put(self, record: dict[str, Any]) -> None:
        try:
            line = _line(record)
        except (TypeError, ValueError):  # what orjson cannot write
            line = record_line(record)
        if not self._records and self._idle(len(line)):
            # The writer waits for a record, none is queued and its last write is older than
            # `linger`: this line is the whole batch, written here (one task step fewer).
            self._last_write = asyncio.get_running_loop().time()
            try:
                self._write_batch(line)
            except Exception:  # as the writer: later records still land
                log.exception("could not write 1 trajectory record")
            return
        if len(self._records) >= self._max_queued or self._space:  # full, or others first
            await self._wait_for_space()
        records = self._records
        records.append(line)  # (the list the writer takes next)
        wake = self._wake
        if wake is not None:
            self._wake = None
            if not wake.done():
                wake.set_result(None)
        elif len(records) >= self._max_queued:  # full: the writer lingers no longer
            self._stop_lingering()

    def _idle(self, size: int) -> bool:
        """Whether a line of `size` bytes may be written at once: the sink is not closing, its
        last write is at least `linger` old and the line does not reach the rotation size."""
        wake = self._wake
        return (wake is not None and not self._closing and not self._space
                and wake.get_loop().time() - self._last_write >= self._linger
                and self._written + size < self._max_bytes)

    async def _wait_for_space(self) -> None:
        loop = asyncio.get_running_loop()
        self._putting += 1
        try:
            while True:
                waiter: asyncio.Future[None] = loop.create_future()
                self._space.append(waiter)
                try:
                    await waiter
                finally:
                    # A caller that gives up still lets those behind it in (woken whole).
                    if waiter in self._space:
                        self._space.remove(waiter)
                if len(self._records) < self._max_queued:
                    return
        finally:
            self._putting -= 1

    def _stop_lingering(self) -> None:
        lingering = self._lingering
        if lingering is not None and not lingering.done():
            lingering.set_result(None)

    def _let_in(self) -> None:
        """Wake every caller waiting for room, in the order they came."""
        space = self._space
        while space:
            waiter = space.popleft()
            if not waiter.done():
                waiter.set_result(None)

    def _write_batch(self, data: bytes) -> None:
        self._file.write(data)
        self._file.flush()
        self._written += len(data)
        if self._written >= self._max_bytes:
            self._rotate()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        backlog = False  # the previous batch left records behind: no wait for them
        while True:
            if not self._records:
                if self._closing:
                    if not self._putting:
                        return
                    # Callers let in (or still waiting) put their records first: a sink
                    # closing with calls blocked on a full queue writes theirs too.
                    self._let_in()
                    await asyncio.sleep(0)
                    continue
                self._wake = loop.create_future()
                await self._wake
                continue
            # A batch waits only until `linger` has passed since the previous write: after a
            # quiet spell a record leaves at once (no timer, no extra wake of the process);
            # otherwise the records of that time leave together in one write.
            wait = self._last_write + self._linger - loop.time()
            if wait > 0 and not self._closing and not backlog and (
                    len(self._records) < self._max_queued):
                lingering = self._lingering = loop.create_future()
                timer = loop.call_later(wait, self._stop_lingering)
                try:
                    await lingering
                finally:
                    timer.cancel()
                    self._lingering = None
            self._last_write = loop.time()
            batch = self._records
            backlog = len(batch) > _BATCH_MAX
            if backlog:
                batch, self._records = batch[:_BATCH_MAX], batch[_BATCH_MAX:]
            else:
                self._records = []
            self._let_in()
            try:
                data = b"".join(batch)
                if self._written + len(data) >= self._max_bytes or (
                        len(batch) > _INLINE_MAX_RECORDS):
                    # Rotation (maybe gzip) or a large batch: keep the event loop free.
                    await asyncio.to_thread(self._write_batch, data)
                else:
                    # A small batch is one write to the page cache: cheaper inline than the
                    # thread hand-off and GIL ping-pong a worker thread would cost per batch.
                    self._write_batch(data)
            except Exception:  # the writer outlives a failed batch: later records still land
                log.exception("could not write %d trajectory records", len(batch))

    async def close(self) -> None:
        if self._task is not None:
            self._closing = True
            wake = self._wake
            if wake is not None and not wake.done():
                wake.set_result(None)
            self._stop_lingering()  # (what is queued is written now)
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._file is not None:
            self._file.close()
            self._file = None
