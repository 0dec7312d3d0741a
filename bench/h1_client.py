"""What an upstream HTTP client costs a model call: CPU time per POST, aiohttp beside budgetproxy's
own HTTP/1.1 client (budgetproxy/proxy/h1.py), in one process, rounds alternating. The built-in
client runs three ways: as configured by default (a kept connection reused after 0.25 s quiet),
reusing at once (`reuse_quiet_s: 0`), and with a connection per call (`reuse_connections:
false`).

The client runs pinned to one core on uvloop (as `budgetproxy serve` does) with 32 calls in
flight, each a ~500-byte chat body answered by the fake upstream on the other core; CPU time is
the client process's own (user + system) over the counted calls. The ratio of the two, round by
round, is the figure: it is the measured reason the proxy carries its own client.

    python bench/h1_client.py                 # 5 rounds of 20,000 calls per client
    python bench/h1_client.py --rounds 3 --calls 5000
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent))

import targets as tg  # noqa: E402

from budgetproxy.proxy import h1  # noqa: E402

BODY = (b'{"model":"m1","messages":[{"role":"system","content":"You are a helpful assistant."},'
        b'{"role":"user","content":"' + b"x" * 400 + b'"}]}')
HEADERS = {"content-type": "application/json", "authorization": "Bearer k"}


async def cpu_per_call(call: Callable[[], Awaitable[None]], calls: int, concurrency: int) -> float:
    """µs of this process's CPU per call, `concurrency` calls in flight (after a warm-up)."""
    async def worker(n: int) -> None:
        for _ in range(n):
            await call()
    await asyncio.gather(*[worker(50) for _ in range(concurrency)])
    t = time.process_time()
    await asyncio.gather(*[worker(calls // concurrency) for _ in range(concurrency)])
    return (time.process_time() - t) / (calls // concurrency * concurrency) * 1e6


async def with_aiohttp(url: str, calls: int, concurrency: int) -> float:
    connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, keepalive_timeout=60)
    timeout = aiohttp.ClientTimeout(total=600, connect=10)
    async with aiohttp.ClientSession(connector=connector,
                                     skip_auto_headers=("User-Agent",)) as session:
        async def call() -> None:
            resp = await session.post(url, data=BODY, headers=HEADERS, timeout=timeout,
                                      allow_redirects=False)
            await resp.read()
            resp.release()
        return await cpu_per_call(call, calls, concurrency)


async def with_h1(host: str, port: int, path: bytes, calls: int, concurrency: int,
                  **origin_kw: Any) -> float:
    origin = h1.Origin(host, port, **origin_kw)
    host_header = f"{host}:{port}".encode()

    async def call() -> None:
        resp = await origin.post(path, host_header, HEADERS, BODY, timeout_s=600,
                                 connect_timeout_s=10)
        await resp.read()
        resp.release()
    try:
        await cpu_per_call(call, calls, concurrency)  # the pool grows to what the rate needs
        return await cpu_per_call(call, calls, concurrency)
    finally:
        origin.close()


H1_ROWS: dict[str, dict[str, Any]] = {
    "h1": {},  # the defaults
    "h1 quiet 0": {"quiet_s": 0.0},
    "h1 no reuse": {"reuse": False},
}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--calls", type=int, default=20_000, help="counted calls per client a round")
    p.add_argument("--concurrency", type=int, default=32)
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench-h1-"))
    upstream = tg.start_upstream(work, 8, 0.0)
    if (os.cpu_count() or 1) > 1 and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {int(tg.SERVER_CORE)})
    url = upstream.base_url + "/chat/completions"
    host, port = "127.0.0.1", int(url.split(":")[2].split("/")[0])
    rows: dict[str, list[float]] = {"aiohttp": [], **{name: [] for name in H1_ROWS}}
    try:
        for r in range(args.rounds):
            with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                rows["aiohttp"].append(runner.run(with_aiohttp(url, args.calls,
                                                               args.concurrency)))
                for name, kw in H1_ROWS.items():
                    rows[name].append(runner.run(with_h1(
                        host, port, b"/v1/chat/completions", args.calls, args.concurrency,
                        **kw)))
            print(f"round {r + 1}: " + ", ".join(f"{name} {v[-1]:.1f} µs/call"
                                                 for name, v in rows.items()), flush=True)
    finally:
        tg.stop(upstream.proc)
    print(f"\nCPU per call at concurrency {args.concurrency}, medians of {args.rounds} rounds, "
          "and each row's ratio to h1's (round by round):")
    for name, values in rows.items():
        ratios = [v / b for v, b in zip(values, rows["h1"], strict=True)]
        print(f"  {name:12s} {statistics.median(values):6.1f} µs  "
              f"{statistics.median(ratios):.2f}x (rounds {min(ratios):.2f}-{max(ratios):.2f}x)")


if __name__ == "__main__":
    main()
