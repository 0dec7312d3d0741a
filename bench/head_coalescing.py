"""What coalescing a response's head with its body saves the server: CPU time per response of
a minimal HTTP/1.1 responder writing each answer as two writes (head, then body: what uvicorn's
request cycle does) or through `HeadWithBody` (budgetproxy/serve/http_limits.py), which joins
them into one write, in one process, rounds alternating.

The responder runs on uvloop (as `budgetproxy serve` does), pinned to one core; wrk drives it
closed-loop from the other core with keep-alive connections. Every request gets the same
answer (a realistic model-call head and a 300-byte JSON body), so the two variants differ by
the writes alone: one `send` system call a response instead of two, and the loop callback
`HeadWithBody` schedules to flush a head nothing followed. CPU time is the responder process's
own (user + system) over the counted seconds; the ratio of the two variants, round by round,
is the figure.

    python bench/head_coalescing.py                   # 7 rounds of 3 s per variant
    python bench/head_coalescing.py --rounds 9 --seconds 4 --connections 32
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent))

import targets as tg  # noqa: E402

from budgetproxy.serve.http_limits import HeadWithBody  # noqa: E402

BODY = (b'{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"fake-model",'
        b'"choices":[{"index":0,"message":{"role":"assistant","content":"down"},'
        b'"finish_reason":"stop"}],"usage":{"prompt_tokens":96,"completion_tokens":1,'
        b'"total_tokens":97}}' + b" " * 64)
HEAD = (b"HTTP/1.1 200 OK\r\ndate: Sun, 06 Dec 2026 23:00:00 GMT\r\nserver: uvicorn\r\n"
        b"content-type: application/json\r\nx-episode-id: bench-1\r\nx-episode-turn: 7\r\n"
        b"x-episode-budget: 20\r\nx-episode-remaining: 13\r\ncontent-length: %d\r\n\r\n"
        % len(BODY))


class Responder(asyncio.Protocol):
    """Answers every request head it reads with HEAD and BODY, as two writes."""

    coalesce = False  # class-wide: the round's variant

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: Any = transport
        self.writer: Any = (HeadWithBody(transport, asyncio.get_running_loop())  # type: ignore[arg-type]
                            if self.coalesce else transport)
        self.pending = b""

    def data_received(self, data: bytes) -> None:
        data = self.pending + data
        requests = data.count(b"\r\n\r\n")
        self.pending = data[data.rfind(b"\r\n\r\n") + 4:] if requests else data
        for _ in range(requests):
            self.writer.write(HEAD)
            self.writer.write(BODY)


def cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


def wrk(port: int, connections: int, seconds: float) -> int:
    """Requests answered in one closed-loop wrk run (its summary line)."""
    argv = tg.pinned(tg.CLIENT_CORE, ["wrk", "-t1", f"-c{connections}", f"-d{round(seconds)}s",
                                      f"http://127.0.0.1:{port}/"])
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    found = re.search(r"(\d+) requests in", out)
    if found is None or "Non-2xx" in out or "Socket errors" in out:
        raise SystemExit(f"wrk failed or saw errors:\n{out}")
    return int(found.group(1))


async def round_(port: int, coalesce: bool, args: argparse.Namespace) -> float:
    """µs of responder CPU a response, for one variant."""
    Responder.coalesce = coalesce
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, wrk, port, args.connections, 1)  # warm-up, new connections
    before = cpu_seconds()
    answered = await loop.run_in_executor(None, wrk, port, args.connections, args.seconds)
    return (cpu_seconds() - before) * 1e6 / answered


async def main_async(args: argparse.Namespace) -> int:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(Responder, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    plain: list[float] = []
    joined: list[float] = []
    try:
        for r in range(args.rounds):
            for coalesce in (r % 2 == 1, r % 2 == 0):  # which goes first alternates
                (joined if coalesce else plain).append(await round_(port, coalesce, args))
            print(f"round {r + 1}: two writes {plain[-1]:.2f} µs/response, "
                  f"HeadWithBody {joined[-1]:.2f} µs/response", flush=True)
    finally:
        server.close()
    ratios = [j / p for j, p in zip(joined, plain, strict=True)]
    print(f"\nCPU per response, {args.connections} connections, medians of {args.rounds} rounds:")
    print(f"  two writes {statistics.median(plain):.2f} µs, HeadWithBody "
          f"{statistics.median(joined):.2f} µs; HeadWithBody / two writes = "
          f"{statistics.median(ratios):.3f}x (rounds {min(ratios):.3f}-{max(ratios):.3f}x)")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--seconds", type=float, default=3.0, help="counted wrk run per variant")
    p.add_argument("--connections", type=int, default=8)
    args = p.parse_args(argv)
    if shutil.which("wrk") is None:
        print("needs wrk (Debian: apt-get install wrk)", file=sys.stderr)
        return 2
    if shutil.which("taskset") and (os.cpu_count() or 1) > 1:
        os.sched_setaffinity(0, {int(tg.SERVER_CORE)})
    return uvloop.run(main_async(args))


if __name__ == "__main__":
    raise SystemExit(main())
