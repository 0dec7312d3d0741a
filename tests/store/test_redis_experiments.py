"""Live experiments on Redis: two replicas share one experiment's outcomes, and its stop."""

from __future__ import annotations

import time

import pytest
from conftest import ProxyFactory, chat_body, new_id
from experiments_support import experiment_config, report, run_episode
from redis_support import REDIS_URL, drop_prefix, new_prefix, require_redis

from budgetproxy.proxy.experiments import STOP_RECHECK_S

pytestmark = [pytest.mark.redis]


def test_replicas_share_the_tally_and_the_stop(proxy: ProxyFactory) -> None:
    require_redis()
    prefix = new_prefix()
    try:
        over = {**experiment_config(stop="auto"),
                "store": {"kind": "redis", "url": REDIS_URL, "key_prefix": prefix}}
        a, b = proxy(over, fresh=True), proxy(over, fresh=True)
        arms = []
        for i in range(200):
            p = (a, b)[i % 2]
            eid = new_id()
            arm = run_episode(p, eid)
            report((b, a)[i % 2], eid, arm == "hidden")  # ended on the other replica
            arms.append(arm)
            # (an outcome reported while the last turn settles is recorded by that settle)
            deadline = time.monotonic() + 5
            while True:
                view_a = a.http().get("/v1/experiments/disclosure").json()
                view_b = b.http().get("/v1/experiments/disclosure").json()
                if all(sum(x["episodes"] for x in v["arms"]) == i + 1
                       for v in (view_a, view_b)) or time.monotonic() > deadline:
                    break
                time.sleep(0.01)
            assert view_a["arms"] == view_b["arms"]
            assert view_a["difference"] == view_b["difference"]
            assert sum(x["episodes"] for x in view_a["arms"]) == i + 1
            if view_a["stopped"] is not None:
                break
            if view_a["decision"] != "continue":
                time.sleep(0.5)  # one of the replicas' sweeps stops it
        assert view_a["stopped"] == "stop_a_better"
        time.sleep(STOP_RECHECK_S)  # the replica that did not stop it sees the stop by then
        assert {run_episode(p, new_id()) for p in (a, b, a, b)} == {"hidden"}
        decisions = [*a.wait_records(1, type="experiment_decision"),
                     *b.records(type="experiment_decision")]
        assert len(decisions) == 1  # written by the replica that stopped it, once
    finally:
        drop_prefix(prefix)


def test_replicas_give_a_task_one_arm(proxy: ProxyFactory) -> None:
    require_redis()
    prefix = new_prefix()
    try:
        over = {**experiment_config(unit="task"),
                "store": {"kind": "redis", "url": REDIS_URL, "key_prefix": prefix}}
        a, b = proxy(over, fresh=True), proxy(over, fresh=True)
        seen: dict[str, set[str]] = {}
        for i in range(8):
            for p in (b, a, b) if i % 2 else (a, b, a):
                seen.setdefault(f"task-{i}", set()).add(
                    run_episode(p, new_id(), **{"X-Episode-Task": f"task-{i}"}))
        assert all(len(arms) == 1 for arms in seen.values())
        firsts = sorted(next(iter(arms)) for arms in seen.values())
        assert firsts == ["hidden"] * 4 + ["told-wrong"] * 4  # blocks counted in the store
    finally:
        drop_prefix(prefix)


async def test_the_store_reads_only_what_is_new_and_sees_a_fresh_start() -> None:
    require_redis()
    from budgetproxy.core.experiment import Finished
    from budgetproxy.store.experiments import RedisExperiments

    prefix = new_prefix()
    one, two = RedisExperiments(REDIS_URL, prefix), RedisExperiments(REDIS_URL, prefix)
    try:
        done = [Finished(f"e{i}", "t", "a", i % 2 == 0, f"2026-12-06T10:00:0{i}.000Z")
                for i in range(6)]
        for f in done[:3]:
            await one.add("x", f)
        assert await two.finished("x") == done[:3]
        for f in done[3:]:
            await one.add("x", f)
        assert await two.finished("x") == done
        assert await one.stop("x", "stop_a_better") and not await two.stop("x", "stop_futile")
        assert await two.stopped("x") == "stop_a_better"
        drop_prefix(prefix)  # deleted to start afresh
        await one.add("x", done[0])
        assert await two.finished("x") == done[:1]
    finally:
        await one.close()
        await two.close()
        drop_prefix(prefix)


@pytest.mark.parametrize("policy", ["fail_open", "fail_closed"])
def test_a_new_experiment_episode_with_the_store_down(proxy: ProxyFactory, policy: str) -> None:
    """No Redis at that address: forwarded uncounted (fail_open) or 503, never a 500."""
    p = proxy({**experiment_config(), "store": {
        "kind": "redis", "url": "redis://127.0.0.1:9/0", "on_unavailable": policy}})
    r = p.http().post("/v1/chat/completions", json=chat_body(),
                      headers={"X-Episode-Id": new_id(), "X-Episode-Experiment": "disclosure"})
    assert r.status_code == (200 if policy == "fail_open" else 503), r.text
    assert p.http().get("/v1/experiments/disclosure").status_code == 503


async def test_reads_at_once_count_each_outcome_once() -> None:
    """A sweep's review and API reads on one replica read the shared list at the same time:
    each outcome is in every answer once."""
    import asyncio

    from budgetproxy.core.experiment import Finished
    from budgetproxy.store.experiments import RedisExperiments

    require_redis()
    prefix = new_prefix()
    store = RedisExperiments(REDIS_URL, prefix)
    try:
        def one(i: int) -> Finished:
            return Finished(f"ep{i}", "t", "hidden", True, f"2026-12-06T10:00:{i:02d}Z")

        for i in range(5):
            await store.add("x", one(i))
        reads = await asyncio.gather(*(store.finished("x") for _ in range(6)))
        assert [len(r) for r in reads] == [5] * 6
        for i in range(5, 8):
            await store.add("x", one(i))
        reads = await asyncio.gather(*(store.finished("x") for _ in range(6)))
        assert [sorted(f.episode_id for f in r) for r in reads] == [
            sorted(f"ep{i}" for i in range(8))] * 6
    finally:
        await store.close()
        drop_prefix(prefix)
