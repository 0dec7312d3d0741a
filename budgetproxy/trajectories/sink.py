"""Trajectory sink: JSONL records written off the request path by one writer task.

Back-pressure: the queue is bounded; when it is full, `put` waits, so calls slow down instead of
records being dropped. The writer lets records gather for a few milliseconds, then writes and
flushes the batch to the OS (small batches inline, large ones and rotations from a thread); a
SIGKILL loses only what was still queued, never a written line. SIGTERM drains the queue before
the process exits.
"""

from __future__ import annotations

import asyncio
import contextlib
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

log = logging.getLogger("budgetproxy.trajectories.sink")


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
        text = json.dumps(record, ensure_ascii=False, allow_nan=False, default=str,
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
        linger_s: float = 0.005,
    ) -> None:
        self._linger = linger_s
        self._dir = Path(directory)
        self._max_bytes = max_file_bytes
        self._gzip = gzip_rotated
        self._queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue(maxsize=queue_size)
        self._task: asyncio.Task[None] | None = None
        self._file: Any = None
        self._path: Path | None = None
        self._written = 0
        self._seq = 0

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
        return self._queue.qsize()

    async def put(self, record: dict[str, Any]) -> None:
        await self._queue.put(record)

    def _write_batch(self, lines: list[bytes]) -> None:
        data = b"".join(lines)
        self._file.write(data)
        self._file.flush()
        self._written += len(data)
        if self._written >= self._max_bytes:
            self._rotate()

    async def _run(self) -> None:
        queue = self._queue
        while True:
            record = await queue.get()
            batch: list[dict[str, Any] | None] = [record]
            if record is not None and self._linger:
                await asyncio.sleep(self._linger)
            while not queue.empty() and len(batch) < 4096:
                batch.append(queue.get_nowait())
            try:
                lines = [record_line(r) for r in batch if r is not None]
                if lines and (
                    self._written + sum(map(len, lines)) >= self._max_bytes
                    or len(lines) > _INLINE_MAX_RECORDS
                ):
                    # Rotation (maybe gzip) or a large batch: keep the event loop free.
                    await asyncio.to_thread(self._write_batch, lines)
                elif lines:
                    # A small batch is one write to the page cache: cheaper inline than the
                    # thread hand-off and GIL ping-pong a worker thread would cost per batch.
                    self._write_batch(lines)
            except Exception:  # the writer outlives a failed batch: later records still land
                log.exception("could not write %d trajectory records", len(batch))
            for _ in batch:
                queue.task_done()
            if None in batch:
                return

    async def close(self) -> None:
        if self._task is not None:
            await self._queue.put(None)
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._file is not None:
            self._file.close()
            self._file = None
