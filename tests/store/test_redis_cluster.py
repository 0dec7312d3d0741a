"""The Redis store on a real Redis Cluster (started by the fixture): every script's keys in
one slot, budgets exact under parallel calls across masters, the episode API and the idle
sweep working, and a master's failover survived without over-spending a budget."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from cluster_support import RedisCluster
from conftest import Proxy, ProxyFactory, chat_body, new_id

from budgetproxy.store.redis import RedisStore

pytestmark = pytest.mark.redis


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    c = RedisCluster(tmp_path_factory.mktemp("cluster"), masters=3, replicas=1).start()
    yield c
    c.stop()


def _store_over(cluster: RedisCluster, prefix: str, **episodes: Any) -> dict[str, Any]:
    over: dict[str, Any] = {"store": {"kind": "redis", "url": cluster.url, "cluster": True,
                                      "key_prefix": prefix}}
    if episodes:
        over["episodes"] = episodes
    return over


@pytest.fixture(scope="module")
def on_cluster(proxy: ProxyFactory, cluster: RedisCluster) -> Proxy:
    return proxy(_store_over(cluster, f"c17-{uuid.uuid4().hex[:6]}"))


def _turn(c: httpx.Client, eid: str, budget: int) -> int:
    r = c.post("/v1/chat/completions", json=chat_body(new_id("t")),
               headers={"X-Episode-Id": eid, "X-Episode-Budget": str(budget)})
    assert r.status_code in (200, 403), r.text
    return r.status_code


def test_an_episodes_keys_share_one_slot(cluster: RedisCluster) -> None:
    store = RedisStore(cluster.url, prefix="slots", cluster=True)
    node = cluster.node(cluster.ports[0])
    for eid in ("ep-1", "team-a/ep-1", "x" * 128):
        slots = {node.execute_command("CLUSTER", "KEYSLOT", k) for k in store._keys(eid)}
        assert len(slots) == 1, (eid, slots)


def test_budgets_are_exact_under_parallel_calls_across_masters(
        on_cluster: Proxy, cluster: RedisCluster) -> None:
    episodes = [new_id("par") for _ in range(24)]
    budget, calls = 3, 8
    http = on_cluster.http(limits=httpx.Limits(max_connections=64))
    with ThreadPoolExecutor(32) as pool:
        codes = list(pool.map(lambda e: _turn(http, e, budget),
                              [e for e in episodes for _ in range(calls)]))
    assert codes.count(200) == budget * len(episodes)
    for eid in episodes:
        ep = on_cluster.episode(eid)
        assert ep["turns_used"] == budget and ep["remaining"] == 0, ep
    prefix = on_cluster.overrides["store"]["key_prefix"]
    owners = {cluster.owner_of(f"{prefix}:ep:{{{e}}}") for e in episodes}
    assert len(owners) == 3, "the episodes did not spread over the masters"


def test_the_episode_api_and_the_idle_sweep_work_on_a_cluster(
        proxy: ProxyFactory, cluster: RedisCluster) -> None:
    p = proxy(_store_over(cluster, f"c17s-{uuid.uuid4().hex[:6]}", idle_timeout_s=0.5,
                          sweep_interval_s=0.2))
    http = p.http()
    made = http.post("/v1/episodes", json={"budget": 2, "task_id": "t1"})
    assert made.status_code == 201
    eid = made.json()["episode_id"]
    assert http.post("/v1/episodes", json={"episode_id": eid}).status_code == 409
    assert _turn(http, eid, 2) == 200
    done = http.post(f"/v1/episodes/{eid}/outcome", json={"success": True})
    assert done.status_code == 200 and done.json()["end_reason"] == "success"
    r = http.post("/v1/chat/completions", json=chat_body("late"), headers={"X-Episode-Id": eid})
    assert r.status_code == 403 and r.json()["error"]["code"] == "episode_finished"
    idle = new_id("idle")
    assert _turn(http, idle, 5) == 200
    deadline = time.monotonic() + 10
    while p.episode(idle)["status"] != "finished":
        assert time.monotonic() < deadline, "the sweep never ended the idle episode"
        time.sleep(0.1)
    assert p.episode(idle)["end_reason"] == "abandoned"
    assert p.wait_records(1, type="episode", episode_id=idle)
    assert http.get("/readyz").status_code == 200


def test_a_master_failover_is_survived_without_over_spending(
        proxy: ProxyFactory, cluster: RedisCluster, tmp_path: Path) -> None:
    prefix = f"c17f-{uuid.uuid4().hex[:6]}"
    p = proxy(_store_over(cluster, prefix), fresh=True)
    http = p.http()
    # an episode on a master whose replica follows it (what a failover needs to keep data)
    for _ in range(50):
        eid = new_id("fail")
        key = f"{prefix}:ep:{{{eid}}}"
        master = cluster.owner_of(key)
        if cluster.replicated(master):
            break
        time.sleep(0.2)
    else:
        raise AssertionError("no master of the cluster has a replica following it")
    assert [_turn(http, eid, 4) for _ in range(2)] == [200, 200]
    # Writes not yet replicated at a failover are Redis's to lose (replication is asynchronous),
    # not the proxy's: wait until the replica itself holds the episode as the master has it.
    # (a new cluster's replicas may still be in their first full sync: allow for it)
    cluster.replicas_hold(master, key, {"turns_used": "2", "inflight": "0", "budget": "4"},
                          timeout=45)
    cluster.kill(master)
    # until a replica takes over: the store is unavailable, answered 503, never a 500
    seen: set[int] = set()
    deadline = time.monotonic() + 30
    while True:
        r = http.post("/v1/chat/completions", json=chat_body(new_id("t")),
                      headers={"X-Episode-Id": eid})
        seen.add(r.status_code)
        if r.status_code == 200:
            break
        assert r.status_code == 503, r.text
        assert r.json()["error"]["code"] == "store_unavailable"
        assert time.monotonic() < deadline, "the cluster never failed over"
        time.sleep(0.2)
    assert 503 in seen and 500 not in seen
    cluster.wait_ok()
    assert _turn(http, eid, 4) == 200  # the 4th turn
    assert _turn(http, eid, 4) == 403  # and no 5th: the budget held across the failover
    ep = p.episode(eid)
    assert ep["turns_used"] == 4 and ep["remaining"] == 0


def test_a_cluster_reached_without_cluster_true_is_a_503_never_a_500(
        proxy: ProxyFactory, cluster: RedisCluster) -> None:
    """It said ready, then answered every call with a 500 (MovedError)."""
    over = _store_over(cluster, f"c17n-{uuid.uuid4().hex[:6]}")
    over["store"]["cluster"] = False
    p = proxy(over, fresh=True)
    codes = set()
    for _ in range(12):  # ids on every master's slots, one of them the node named
        r = p.http().post("/v1/chat/completions", json=chat_body(new_id("n")),
                          headers={"X-Episode-Id": new_id("moved")})
        codes.add(r.status_code)
        if r.status_code != 200:
            assert r.status_code == 503 and r.json()["error"]["code"] == "store_unavailable"
    assert 503 in codes and 500 not in codes


async def test_a_connection_lost_mid_failover_reads_as_the_store_unavailable() -> None:
    """redis-py's cluster client, replacing a failed master's connections, raised these from
    a closed transport; the store answered them as a proxy failure (500), not a 503."""
    import asyncio

    from redis import exceptions as rexc

    from budgetproxy.store.redis import _raised
    from budgetproxy.store.redis_cluster import eval_each, run_each

    class Op:
        keys: list[str] = []
        args: list[str] = []

        def __init__(self, error: BaseException) -> None:
            self.error = error

        async def script(self, **_: Any) -> Any:
            raise self.error

    lost = [RuntimeError("unable to perform operation on <TCPTransport closed=True>"),
            AttributeError("'NoneType' object has no attribute 'writelines'")]
    slots = asyncio.Semaphore(4)
    results = await eval_each([Op(e) for e in lost], slots)
    assert all(isinstance(r, rexc.ConnectionError) for r in results), results
    class Closing:  # a client whose pipeline is built on a closed transport
        def pipeline(self, transaction: bool) -> Any:
            raise lost[0]

    in_turn = await run_each(Closing(), [lambda pipe: pipe.get("k")], Op, slots)
    assert isinstance(in_turn[0], rexc.ConnectionError)
    from budgetproxy.store.base import StoreUnavailable

    with pytest.raises(StoreUnavailable):
        _raised(results[0])
    other = await eval_each([Op(ValueError("a bug of ours"))], slots)
    assert isinstance(other[0], ValueError)  # anything else stays what it is
