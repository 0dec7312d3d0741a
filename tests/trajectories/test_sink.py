"""The JSONL trajectory sink: order kept, back-pressure instead of drops, close drains."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import orjson
import pytest
from conftest import nested

from budgetproxy.trajectories.sink import JsonlSink


def _lines(directory: Path) -> list[dict[str, int]]:
    out = []
    for path in sorted(directory.glob("trajectories-*.jsonl")):
        out += [orjson.loads(line) for line in path.read_bytes().splitlines()]
    return out


@pytest.mark.asyncio
async def test_records_are_written_in_order_and_close_drains(tmp_path: Path) -> None:
    sink = JsonlSink(tmp_path, max_file_bytes=1 << 30, gzip_rotated=False, queue_size=10_000)
    await sink.start()
    for i in range(5000):  # more than one writer batch
        await sink.put({"i": i})
    await sink.close()
    assert [r["i"] for r in _lines(tmp_path)] == list(range(5000))


@pytest.mark.asyncio
async def test_a_full_queue_makes_callers_wait_and_loses_nothing(tmp_path: Path) -> None:
    sink = JsonlSink(tmp_path, max_file_bytes=1 << 30, gzip_rotated=False, queue_size=3,
                     linger_s=0.05)
    await sink.start()
    await asyncio.sleep(0)  # the writer is idle, waiting for a first record
    puts = [asyncio.create_task(sink.put({"i": i})) for i in range(10)]
    # One step each: the first record is written by its put, the next three fill the queue,
    # and the writer (woken by the second) has not run yet.
    await asyncio.sleep(0)
    waiting = [t for t in puts if not t.done()]
    assert len(waiting) == 6  # back-pressure: callers wait instead of records being dropped
    # A caller that gives up while waiting costs nobody else their record.
    waiting[-1].cancel()
    await asyncio.wait_for(asyncio.gather(*waiting[:-1]), 2)
    await sink.close()
    assert [r["i"] for r in _lines(tmp_path)] == list(range(9))


@pytest.mark.asyncio
async def test_rotation_keeps_every_record(tmp_path: Path) -> None:
    sink = JsonlSink(tmp_path, max_file_bytes=200, gzip_rotated=False, queue_size=100)
    await sink.start()
    for i in range(50):
        await sink.put({"i": i, "pad": "x" * 20})
        if i % 10 == 9:
            await asyncio.sleep(0.02)  # let the writer cut several files
    await sink.close()
    assert len(list(tmp_path.glob("trajectories-*.jsonl"))) > 1
    assert sorted(r["i"] for r in _lines(tmp_path)) == list(range(50))


@pytest.mark.asyncio
async def test_records_orjson_cannot_write_are_written_and_the_writer_lives_on(
        tmp_path: Path) -> None:
    """An agent's request can carry what orjson refuses (integers over 64 bits, nesting past
    254 levels): such a record used to end the writer task, silently, and every later record
    with it; calls then waited on a full queue and SIGTERM hung."""
    sink = JsonlSink(tmp_path, max_file_bytes=1 << 30, gzip_rotated=False, queue_size=3)
    await sink.start()
    await sink.put({"i": 0, "big": 10**30})
    await sink.put({"i": 1, "deep": nested(300)})
    await sink.put({"i": 2, "deep": nested(5000), "big": 10**30, "text": "kept"})
    await sink.put({"i": 3, "bad": "\udc80"})
    for i in range(4, 20):  # more than the queue holds: the writer must still be draining it
        await sink.put({"i": i})
    await asyncio.wait_for(sink.close(), 5)
    lines = [json.loads(line) for path in sorted(tmp_path.glob("trajectories-*.jsonl"))
             for line in path.read_bytes().splitlines()]
    assert [r["i"] for r in lines] == list(range(20))
    assert lines[0]["big"] == 10**30
    assert lines[1]["deep"] == nested(300)  # written whole, by the standard library
    assert lines[2]["unencodable"] == ["big", "deep"] and lines[2]["text"] == "kept"
    assert lines[3]["unencodable"] == ["bad"]


@pytest.mark.asyncio
async def test_a_record_after_a_quiet_spell_leaves_at_once_and_later_ones_gather(
        tmp_path: Path) -> None:
    """An agent calling now and then has each record written as it comes (no linger timer
    waking the process once more per call); records that follow a write within `linger_s`
    wait for it to pass and leave together."""
    sink = JsonlSink(tmp_path, max_file_bytes=1 << 30, gzip_rotated=False, queue_size=100,
                     linger_s=0.3)
    await sink.start()
    await sink.put({"i": 0})
    await asyncio.sleep(0.05)
    assert [r["i"] for r in _lines(tmp_path)] == [0]  # written at once, not after 0.3 s
    await sink.put({"i": 1})
    await sink.put({"i": 2})
    await asyncio.sleep(0.05)
    assert [r["i"] for r in _lines(tmp_path)] == [0]  # within linger of that write: waiting
    await asyncio.sleep(0.4)
    assert [r["i"] for r in _lines(tmp_path)] == [0, 1, 2]  # then one batch
    await sink.close()


@pytest.mark.asyncio
async def test_records_written_by_put_and_by_the_writer_keep_their_order(
        tmp_path: Path) -> None:
    """A record after a quiet spell is written by its own `put`; one while others wait goes
    behind them: the file holds every record in the order put, whichever wrote it."""
    sink = JsonlSink(tmp_path, max_file_bytes=1 << 30, gzip_rotated=False, queue_size=100,
                     linger_s=0.05)
    await sink.start()
    await asyncio.sleep(0)  # the writer waits for a first record
    order = 0
    for burst in (1, 3, 1, 5, 2):
        for _ in range(burst):
            await sink.put({"i": order})
            order += 1
        await asyncio.sleep(0.01 if burst % 2 else 0.08)  # sometimes within linger
    await sink.close()
    assert [r["i"] for r in _lines(tmp_path)] == list(range(order))


@pytest.mark.asyncio
async def test_a_full_queue_and_close_cut_the_flush_interval_short(tmp_path: Path) -> None:
    """Records wait for the flush interval only while the queue has room: a full queue is
    written at once (calls do not stall for the interval), and close writes what waits."""
    sink = JsonlSink(tmp_path, max_file_bytes=1 << 30, gzip_rotated=False, queue_size=4,
                     linger_s=30.0)
    await sink.start()
    await asyncio.sleep(0)  # the writer waits for a first record
    await sink.put({"i": 0})  # after a quiet spell: written by its put
    for i in range(1, 4):
        await sink.put({"i": i})
    await asyncio.sleep(0.05)
    assert [r["i"] for r in _lines(tmp_path)] == [0]  # within the interval: waiting
    await asyncio.wait_for(sink.put({"i": 4}), 1)  # the queue is full: written now
    await asyncio.sleep(0.05)
    assert [r["i"] for r in _lines(tmp_path)] == [0, 1, 2, 3, 4]
    for i in range(5, 7):
        await sink.put({"i": i})
    await asyncio.wait_for(sink.close(), 1)  # not 30 s
    assert [r["i"] for r in _lines(tmp_path)] == list(range(7))


@pytest.mark.asyncio
async def test_close_writes_the_records_of_callers_blocked_on_a_full_queue(
        tmp_path: Path) -> None:
    """A sink closed while calls wait for room writes their records too, and lets every one
    of those calls return (the writer used to end once the queue was empty, before the
    callers it had let in put theirs)."""
    sink = JsonlSink(tmp_path, max_file_bytes=1 << 30, gzip_rotated=False, queue_size=4,
                     linger_s=0.05)
    await sink.start()
    await asyncio.sleep(0)
    puts = [asyncio.create_task(sink.put({"i": i})) for i in range(12)]
    await asyncio.sleep(0)  # the queue is full, callers wait
    await asyncio.wait_for(sink.close(), 2)
    await asyncio.wait_for(asyncio.gather(*puts), 2)
    assert [r["i"] for r in _lines(tmp_path)] == list(range(12))


@pytest.mark.asyncio
async def test_a_backlog_past_one_batch_leaves_without_another_interval(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """More records than one batch takes: the rest follow at once, not a flush interval
    later for each batch."""
    from budgetproxy.trajectories import sink as sink_module

    monkeypatch.setattr(sink_module, "_BATCH_MAX", 10)
    sink = JsonlSink(tmp_path, max_file_bytes=1 << 30, gzip_rotated=False, queue_size=100,
                     linger_s=1.0)
    await sink.start()
    await asyncio.sleep(0)
    for i in range(25):  # the first written by its put; 24 wait for the interval
        await sink.put({"i": i})
    await asyncio.sleep(1.6)  # one interval and some: three batches of 10, 10 and 4 by now
    assert [r["i"] for r in _lines(tmp_path)] == list(range(25))
    await sink.close()
