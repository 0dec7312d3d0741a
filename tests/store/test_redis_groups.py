"""Groups on Redis: two replicas share a group; a long poll on one wakes when the last
episode ends on the other."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from redis_support import (
    REDIS_URL,
    ProxyProcess,
    drop_prefix,
    new_prefix,
    require_redis,
    write_config,
)

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
                               trajectories={"dir": str(Path(d) / f"traj-{name}")})
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
