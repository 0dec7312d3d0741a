"""Load: wrk for request/response throughput and latency, an aiohttp client for SSE streams."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import statistics
import subprocess
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp
import orjson
from targets import (
    BENCH_DIR,
    CLIENT_CORE,
    EPISODE_BUDGET,
    Target,
    cpu_seconds,
    percentile,
    pinned,
    rss_bytes,
    sse_data,
)

WRK_SCRIPT = BENCH_DIR / "wrk_chat.lua"


@dataclass
class WrkResult:
    connections: int
    requests: int
    seconds: float
    rps: float
    errors: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    p999_ms: float
    max_ms: float
    # Server CPU time per request: robust to other load on the machine, unlike req/s.
    cpu_us_per_req: float | None = None


# The model-call APIs a row can load: route under the base URL (wrk_chat.lua's BENCH_API).
API_PATHS = {"chat": "/chat/completions", "responses": "/responses", "messages": "/messages"}


def run_wrk(target: Target, connections: int, seconds: float, api: str = "chat") -> WrkResult:
    """One closed-loop wrk run (one thread) against one of the target's model-call routes."""
    argv = [
        "wrk",
        "-t1",
        f"-c{connections}",
        f"-d{max(1, round(seconds))}s",
        "--latency",
        "--timeout",
        "10s",
        "-s",
        str(WRK_SCRIPT),
        target.base_url + API_PATHS[api],
        "--",
        str(target.episodes),
        str(EPISODE_BUDGET),
    ]
    env = {**os.environ, "BENCH_AUTH": target.auth, "BENCH_API": api,
           "BENCH_HEADERS": target.headers, "BENCH_BODY_FIELDS": target.body_fields}
    cpu_before = cpu_seconds(target.pid) if target.pid else None
    out = subprocess.run(
        pinned(CLIENT_CORE, argv), capture_output=True, text=True, env=env, timeout=seconds + 60
    )
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("BENCH_JSON ")), None)
    if line is None:
        raise RuntimeError(f"wrk gave no summary: {out.stdout[-500:]} {out.stderr[-500:]}")
    data: dict[str, Any] = json.loads(line.removeprefix("BENCH_JSON "))
    cpu_us = None
    if cpu_before is not None and target.pid and data["requests"]:
        cpu_us = round((cpu_seconds(target.pid) - cpu_before) * 1e6 / data["requests"], 1)
    secs = data["duration_us"] / 1e6
    lat = data["latency_us"]
    return WrkResult(
        connections=connections,
        requests=data["requests"],
        seconds=round(secs, 3),
        rps=round(data["requests"] / secs, 1) if secs else 0.0,
        errors=sum(data["errors"].values()),
        p50_ms=lat["p50"] / 1000,
        p90_ms=lat["p90"] / 1000,
        p99_ms=lat["p99"] / 1000,
        p999_ms=lat["p999"] / 1000,
        max_ms=lat["max"] / 1000,
        cpu_us_per_req=cpu_us,
    )


# ---- streams -------------------------------------------------------------------------------

# The fake upstream echoes the prompt split into N chunks: long enough for 64 non-empty ones.
_FILLER = "a long answer in many small pieces, " * 12
# Every stream is a new episode with a distinct body (never a retry of an earlier turn).
_stream_ids = itertools.count()
_STREAM_BODY = {
    "model": "fake-model",
    "stream": True,
    "messages": [{"role": "user", "content": "stream please, many small chunks of text"}],
}


@dataclass
class StreamStats:
    streams: int
    completed: int
    ttft_ms: list[float] = field(default_factory=list)
    gaps_ms: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def _stream_body(api: str, text: str) -> dict[str, Any]:
    if api == "responses":
        return {"model": "fake-model", "stream": True, "input": text}
    if api == "messages":
        return {"model": "fake-model", "stream": True, "max_tokens": 64,
                "messages": [{"role": "user", "content": text}]}
    return {**_STREAM_BODY, "messages": [{"role": "user", "content": text}]}


def _text_piece(api: str, event: Any) -> tuple[bool, bool]:
    """Whether an SSE payload carries answer text, and whether it ends the stream."""
    if not isinstance(event, dict):
        return False, False
    if api == "chat":
        choices = event.get("choices") or []
        return bool(choices and (choices[0].get("delta") or {}).get("content")), False
    kind = event.get("type")
    if api == "responses":
        return (kind == "response.output_text.delta" and bool(event.get("delta")),
                kind == "response.completed")
    delta = event.get("delta") or {}
    return (kind == "content_block_delta" and bool(delta.get("text")),
            kind == "message_stop")


async def _one_stream(
    session: aiohttp.ClientSession,
    target: Target,
    headers: dict[str, str],
    stats: StreamStats,
    want_chunks: int,
    api: str = "chat",
) -> None:
    serial = next(_stream_ids)
    text = f"stream {serial}: " + _FILLER
    body = _stream_body(api, text)
    hdrs = {"Content-Type": "application/json", **target.header_dict(), **headers}
    if target.auth:
        hdrs["Authorization"] = f"Bearer {target.auth}"
    if target.episodes:
        hdrs["X-Episode-Id"] = f"bench-stream-{serial}"
        hdrs["X-Episode-Budget"] = str(EPISODE_BUDGET)
    start = time.perf_counter()
    arrivals: list[float] = []
    done = False
    try:
        url = target.base_url + API_PATHS[api]
        async with session.post(url, data=orjson.dumps(body), headers=hdrs) as resp:
            if resp.status != 200:
                stats.errors.append(f"HTTP {resp.status}")
                return
            async for payload in sse_data(resp.content):
                if payload == b"[DONE]":
                    done = True
                    break
                text_piece, last = _text_piece(api, orjson.loads(payload))
                if text_piece:
                    arrivals.append(time.perf_counter())
                if last:
                    done = True
                    break
    except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
        stats.errors.append(type(exc).__name__)
        return
    if not done or len(arrivals) < want_chunks:
        stats.errors.append(f"incomplete: {len(arrivals)}/{want_chunks} chunks, done={done}")
        return
    stats.completed += 1
    stats.ttft_ms.append((arrivals[0] - start) * 1000)
    stats.gaps_ms.extend((b - a) * 1000 for a, b in zip(arrivals, arrivals[1:], strict=False))


async def _streams(
    target: Target,
    concurrency: int,
    rounds: int,
    headers: dict[str, str],
    want_chunks: int,
    stagger_s: float,
    timeout_s: float,
    on_tick: Any = None,
    api: str = "chat",
) -> StreamStats:
    stats = StreamStats(streams=concurrency * rounds, completed=0)
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def launch(delay: float) -> None:
            await asyncio.sleep(delay)
            await _one_stream(session, target, headers, stats, want_chunks, api)

        for _ in range(rounds):
            tasks = [
                asyncio.create_task(launch(stagger_s * i / concurrency)) for i in range(concurrency)
            ]
            if on_tick is not None:
                ticker = asyncio.create_task(on_tick())
            await asyncio.gather(*tasks)
            if on_tick is not None:
                ticker.cancel()
    return stats


def stream_latency(target: Target, concurrency: int, rounds: int, chunks: int,
                   api: str = "chat") -> dict[str, Any]:
    """TTFT and inter-chunk gaps over ``rounds`` of ``concurrency`` simultaneous streams."""
    # A discarded warm-up round: the first streams through a fresh server pay for lazy setup.
    asyncio.run(_streams(target, concurrency, 1, {}, chunks, 0.0, 60.0, api=api))
    stats = asyncio.run(_streams(target, concurrency, rounds, {}, chunks, 0.0, 60.0, api=api))
    return {
        "streams": stats.streams,
        "completed": stats.completed,
        "errors": stats.errors[:10],
        "ttft_p50_ms": percentile(stats.ttft_ms, 50),
        "ttft_p99_ms": percentile(stats.ttft_ms, 99),
        "gap_p50_ms": percentile(stats.gaps_ms, 50),
        "gap_p99_ms": percentile(stats.gaps_ms, 99),
        "gap_mean_ms": round(statistics.fmean(stats.gaps_ms), 3) if stats.gaps_ms else None,
    }


def slow_streams(target: Target, count: int, chunks: int) -> dict[str, Any]:
    """Hold ``count`` streams of one chunk a second; the server's peak RSS and dropped streams."""
    pid = target.pid
    baseline = rss_bytes(pid) if pid else 0
    peak = [baseline]

    async def sample() -> None:
        while True:
            if pid:
                peak[0] = max(peak[0], rss_bytes(pid))
            await asyncio.sleep(0.5)

    headers = {"X-Fake-Chunks": str(chunks), "X-Fake-Chunk-Gap-Ms": "1000"}
    started = time.monotonic()
    stats = asyncio.run(
        _streams(target, count, 1, headers, chunks, 1.0, chunks + 60.0, on_tick=sample)
    )
    mib = 1024 * 1024
    return {
        "streams": stats.streams,
        "completed": stats.completed,
        "dropped": stats.streams - stats.completed,
        "errors": sorted(set(stats.errors))[:10],
        "seconds": round(time.monotonic() - started, 1),
        "rss_before_mib": round(baseline / mib, 1) if pid else None,
        "rss_peak_mib": round(peak[0] / mib, 1) if pid else None,
        "gap_p99_ms": percentile(stats.gaps_ms, 99),
    }


def as_dict(result: WrkResult) -> dict[str, Any]:
    return asdict(result)
