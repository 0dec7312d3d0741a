"""Rollouts on Redis: two replicas share a group (a long poll on one wakes when the last
episode ends on the other) and serve each other's episodes' trajectories."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from records_support import BytesEntry
from redis_support import (
    REDIS_URL,
    ProxyProcess,
    drop_prefix,
    new_prefix,
    require_redis,
    write_config,
)

from budgetproxy.store.redis import RedisStore
from budgetproxy.testing.fake_upstream import FakeUpstream

pytestmark = [pytest.mark.redis, pytest.mark.slow]


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    require_redis()
    prefix = new_prefix()
    up = FakeUpstream().start()
    d = tmp_path_factory.mktemp("groups")
    procs = []
    try:
        for name in ("a", "b"):
            cfg = write_config(Path(d) / f"{name}.yaml", up.base_url,
                               store={"kind": "redis", "url": REDIS_URL, "key_prefix": prefix},
                               trajectories={"dir": str(Path(d) / f"traj-{name}")},
                               upstreams=[{"name": "fake", "base_url": up.base_url,
                                           "capture_tokens": True}],
                               server={"forward_headers": ["x-fake-*"]})
            procs.append(ProxyProcess(cfg, Path(d) / f"{name}.log").start())
        yield procs[0].url, procs[1].url
    finally:
        for p in procs:
            p.stop()
        up.stop()
        drop_prefix(prefix)


def test_long_poll_on_other_replica(replicas: tuple[str, str]) -> None:
    a, b = replicas
    task = f"task-{time.time_ns()}"
    ids = [f"ep-{task}-{i}" for i in range(3)]
    with httpx.Client(timeout=20) as c:
        r = c.post(b + "/v1/groups", json={"task_id": task, "group": "g", "size": 3})
        assert r.status_code == 201, r.text
        for i, eid in enumerate(ids):
            r = c.post((a if i % 2 == 0 else b) + "/v1/chat/completions",
                       json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
                       headers={"X-Episode-Id": eid, "X-Episode-Task": task,
                                "X-Episode-Group": "g"})
            assert r.status_code == 200, r.text
        for eid in ids[:2]:
            assert c.post(a + f"/v1/episodes/{eid}/outcome",
                          json={"success": True, "reward": 1.0}).status_code == 200
    got: dict[str, Any] = {}

    def poll() -> None:
        with httpx.Client(timeout=30) as c:
            r = c.get(b + f"/v1/groups/{task}/g", params={"wait": "true", "timeout_s": 20})
            got["view"], got["at"] = r.json(), time.monotonic()

    t = threading.Thread(target=poll)
    t.start()
    time.sleep(0.7)
    assert "view" not in got
    ended_at = time.monotonic()
    with httpx.Client(timeout=20) as c:
        assert c.post(a + f"/v1/episodes/{ids[2]}/outcome",
                      json={"success": False, "reward": 0.0}).status_code == 200
    t.join(10)
    view = got["view"]
    assert view["done"] is True and got["at"] - ended_at < 0.5, got["at"] - ended_at
    assert [e["episode_id"] for e in view["episodes"]] == ids
    assert [e["advantage"] for e in view["episodes"]] == pytest.approx([1 / 3, 1 / 3, -2 / 3])


def test_trajectory_from_other_replica(replicas: tuple[str, str]) -> None:
    from budgetproxy.testing import fake_tokens

    a, b = replicas
    eid = f"ep-traj-{time.time_ns()}"
    messages = [{"role": "user", "content": "hello there"}]
    with httpx.Client(timeout=20) as c:
        for url in (a, b):  # one turn on each replica
            r = c.post(url + "/v1/chat/completions", json={"model": "m", "messages": messages},
                       headers={"X-Episode-Id": eid, "X-Fake-Token-Server": "vllm"})
            assert r.status_code == 200, r.text
            messages = [*messages, r.json()["choices"][0]["message"],
                        {"role": "user", "content": "more"}]
        assert c.post(a + f"/v1/episodes/{eid}/end").status_code == 200
        data = c.get(b + f"/v1/episodes/{eid}/trajectory").json()
    assert [t["turn"] for t in data["turns"]] == [1, 2]
    assert data["turns"][1]["prompt_token_ids"] == fake_tokens.prompt_ids(messages[:3])
    assert data["append_only"] is True


async def test_redis_turn_log_bounds() -> None:
    from budgetproxy.store.turn_log import RedisTurnLog

    require_redis()
    prefix = new_prefix()
    store = RedisStore(REDIS_URL, prefix=prefix)
    log = RedisTurnLog(store, retention_s=60, max_episode_bytes=100, max_turns=3)
    try:
        for i in range(5):
            await log.append("ep", BytesEntry(b'{"turn":%d,"messages":"%s"}' % (i, b"x" * 40),
                                              b'{"turn":%d,"truncated":true}' % i))
        got = await log.read("ep")
        assert got == [b'{"turn":0,"messages":"' + b"x" * 40 + b'"}',
                       b'{"turn":1,"truncated":true}', b'{"turn":2,"truncated":true}']
        assert await log.read("nope") is None
    finally:
        await log.close()
        await store.close()
        drop_prefix(prefix)


def _redis_clients() -> int:
    import redis

    return int(redis.Redis.from_url(REDIS_URL).info("clients")["connected_clients"])


def _proc_status(url: str, field: str) -> int:
    """A field of the serving process's /proc status (VmRSS in kB), found by its port."""
    import subprocess

    port = url.rsplit(":", 1)[1]
    pid = subprocess.run(["fuser", f"{port}/tcp"], capture_output=True,
                         text=True).stdout.split()[0]
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(field)


def test_two_thousand_long_polls_take_one_subscription_and_model_calls_go_on(
        replicas: tuple[str, str]) -> None:
    """2,000 clients wait on a group's end at once: Redis sees a few connections more, not
    2,000; model calls meanwhile are answered; every waiter wakes when the group is done."""
    import asyncio

    a, b = replicas
    task = f"waiters-{time.time_ns()}"
    eid = f"ep-{task}"
    with httpx.Client(timeout=20) as c:
        assert c.post(a + "/v1/groups", json={"task_id": task, "group": "g",
                                              "size": 1}).status_code == 201
        assert c.post(a + "/v1/chat/completions",
                      json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
                      headers={"X-Episode-Id": eid, "X-Episode-Task": task,
                               "X-Episode-Group": "g"}).status_code == 200
    clients_before = _redis_clients()
    rss_before = _proc_status(a, "VmRSS")

    async def go() -> tuple[list[Any], list[float], int, int]:
        limits = httpx.Limits(max_connections=2100, max_keepalive_connections=0)
        async with httpx.AsyncClient(timeout=60, limits=limits) as client:
            polls = [asyncio.ensure_future(client.get(
                f"{a if i % 2 else b}/v1/groups/{task}/g?wait=true&timeout_s=45"))
                for i in range(2000)]
            await asyncio.sleep(8)  # every poll is in and waiting
            assert not any(p.done() for p in polls), "a long poll ended early"
            during = _redis_clients()
            rss = _proc_status(a, "VmRSS")
            took = []
            for i in range(5):
                t = time.monotonic()
                r = await client.post(a + "/v1/chat/completions", json={
                    "model": "m", "messages": [{"role": "user", "content": f"meanwhile {i}"}]},
                    headers={"X-Episode-Id": f"{eid}-other-{i}"})
                assert r.status_code == 200, r.text
                took.append(time.monotonic() - t)
            r = await client.post(b + f"/v1/episodes/{eid}/outcome", json={"success": True})
            assert r.status_code == 200
            done = await asyncio.wait_for(asyncio.gather(*polls), 30)
            return done, took, during, rss

    done, took, during, rss = asyncio.run(go())
    bad = [(r.status_code, r.text[:200]) for r in done
           if r.status_code != 200 or not r.json()["done"]]
    assert not bad, (len(bad), bad[:3])
    assert during - clients_before <= 10, (clients_before, during)
    assert sorted(took)[len(took) // 2] < 1.0, took  # (the first may wait on a busy machine)
    assert rss - rss_before < 200_000, (rss_before, rss)  # kB: under ~100 kB a waiter
