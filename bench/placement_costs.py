"""What a disclosed turn's open_turn script costs Redis as the episode grows (history: keep):
its time in Redis (SLOWLOG, every call logged, by script) and the bytes Redis sent back, for
the last `--measured` turns (never the first) of episodes of each length, driven through
RedisStore alone on a private redis-server. The caller tells the store what it holds of the
placements, as the proxy does once it has answered the episode's previous turn (a release
without that argument is measured without it).

    python bench/placement_costs.py --turns 10,400
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import sys
import tempfile
from pathlib import Path
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))

import targets as tg  # noqa: E402
from long_episodes import start_redis  # noqa: E402

from budgetproxy.core.episode import EpisodeState, SettleResult  # noqa: E402
from budgetproxy.store.redis import RedisStore  # noqa: E402


async def episode(store: RedisStore, server: Any, turns: int, measured: int) -> tuple[float, float]:
    """(microseconds in open_turn's script, bytes sent) per measured turn."""
    eid = f"pc-{turns}"
    tells = "placements_known" in inspect.signature(store.open_turn).parameters
    known = None
    us = sent = 0
    sha = store._open.sha

    def fresh() -> EpisodeState:
        return EpisodeState(episode_id=eid, budget=10**6, max_turns=None, disclosure="disclosed")

    for turn in range(1, turns + 1):
        count = 2 * turn
        digest = f"{1000 * count}:{turn:032x}"
        kw: dict[str, Any] = {"placements_known": known} if tells else {}
        mark = turn > turns - measured
        if mark:
            server.slowlog_reset()
            before = server.info("stats")["total_net_output_bytes"]
        opened = await store.open_turn(eid, fresh, f"b{turn}", 1000.0 + turn, free_retries=0,
                                       message_count=count, disclosure_index=count - 1,
                                       fingerprint=digest, **kw)
        if mark:
            sent += server.info("stats")["total_net_output_bytes"] - before
            us += sum(e["duration"] for e in server.slowlog_get(100)
                      if e["command"].split()[1:2] == [sha.encode()])
        await store.close_turn(eid, opened.grant, SettleResult.OK, 1000.0 + turn,
                               count_failed=False)
        if tells:
            from budgetproxy.core.episode import Known  # (a release that has it)

            known = Known(turn, digest, ())
    return us / measured, sent / measured


async def run(url: str, lengths: list[int], measured: int) -> None:
    server = redis.Redis.from_url(url)
    server.config_set("slowlog-log-slower-than", 0)
    server.config_set("slowlog-max-len", 1000)
    # what reading the counter itself sends (one INFO reply), taken off below
    a = server.info("stats")["total_net_output_bytes"]
    info = server.info("stats")["total_net_output_bytes"] - a
    store = RedisStore(url, prefix="pc")
    try:
        for turns in lengths:
            # (the episode's first turn, answered whole, is not measured)
            us, sent = await episode(store, server, turns, min(measured, turns - 1))
            print(f"{turns:4} turns  open_turn in Redis {us:7.1f} us  reply "
                  f"{sent - info:7.0f} B", flush=True)
    finally:
        await store.close()
        server.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--turns", default="10,400")
    p.add_argument("--measured", type=int, default=20)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="bp-placements-") as tmp:
        proc, url = start_redis(Path(tmp))
        try:
            asyncio.run(run(url, [int(t) for t in args.turns.split(",")], args.measured))
        finally:
            tg.stop(proc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
