"""Redis going away and coming back: StoreUnavailable, fail_closed / fail_open, recovery.

These tests stop and restart a redis-server of their own (append-only, so data survives the
restart but the script cache does not), never the shared one.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import redis
from records_support import BytesEntry
from redis_support import ProxyProcess, RedisServer, metric_total, write_config

from budgetproxy.core.episode import EpisodeState, FinishStatus, GrantKind, SettleResult
from budgetproxy.store.base import StoreUnavailable
from budgetproxy.store.redis import RedisStore
from budgetproxy.store.turn_log import RedisTurnLog
from budgetproxy.testing.fake_upstream import FakeUpstream

pytestmark = [pytest.mark.redis, pytest.mark.slow]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    with RedisServer(tmp_path) as s:
        yield s


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeUpstream]:
    up = FakeUpstream().start()
    yield up
    up.stop()


def fresh(eid: str, budget: int = 10) -> EpisodeState:
    now = time.time()
    return EpisodeState(episode_id=eid, budget=budget, max_turns=None, disclosure="hidden",
                        created_at=now, last_activity=now)


async def test_store_reports_outage_and_recovers_with_its_data(server: RedisServer) -> None:
    store = RedisStore(server.url, prefix="outage")
    eid = "ep-1"
    try:
        first = await store.open_turn(eid, lambda: fresh(eid), "a", time.time(), free_retries=0,
                                      message_count=1, disclosure_index=None)
        await store.close_turn(eid, first.grant, SettleResult.OK, time.time(),
                               count_failed=False)
        server.stop()
        assert not await store.ping()
        with pytest.raises(StoreUnavailable):
            await store.open_turn(eid, lambda: fresh(eid), "b", time.time(), free_retries=0,
                                  message_count=1, disclosure_index=None)
        with pytest.raises(StoreUnavailable):
            await store.get(eid)
        with pytest.raises(StoreUnavailable):
            await store.finish(eid, None, time.time())
        with pytest.raises(StoreUnavailable):
            await store.expire_idle(time.time(), 1, 1)

        server.start()  # same data (append-only file), empty script cache: NOSCRIPT
        assert await store.ping()
        # Several turns at once go out as one pipeline: its NOSCRIPT path reloads too.
        opened = await asyncio.gather(*(
            store.open_turn(eid, lambda: fresh(eid), f"c{i}", time.time(), free_retries=0,
                            message_count=1, disclosure_index=None) for i in range(5)))
        assert sorted(o.grant.turn for o in opened) == [2, 3, 4, 5, 6]
        assert all(not o.created for o in opened)

        server.stop()
        await asyncio.sleep(0.2)  # a serving proxy's loop sees its pooled connections close
        server.start()
        done = await store.finish(eid, None, time.time())  # pipeline after a restart
        assert done.status is FinishStatus.FINISHED
        assert done.state is not None and done.state.turns_used == 6
    finally:
        await store.close()


async def test_a_hung_redis_times_out_into_store_unavailable(server: RedisServer) -> None:
    store = RedisStore(server.url, prefix="hung", socket_timeout_s=0.5)
    eid = "ep-hung"
    try:
        await store.open_turn(eid, lambda: fresh(eid), "a", time.time(), free_retries=0,
                              message_count=1, disclosure_index=None)
        server.pause()
        t0 = time.monotonic()
        with pytest.raises(StoreUnavailable):
            await store.open_turn(eid, lambda: fresh(eid), "b", time.time(), free_retries=0,
                                  message_count=1, disclosure_index=None)
        with pytest.raises(StoreUnavailable):
            await store.get(eid)
        assert not await store.ping()
        assert time.monotonic() - t0 < 5
        server.resume()
        again = await store.open_turn(eid, lambda: fresh(eid), "c", time.time(),
                                      free_retries=0, message_count=1, disclosure_index=None)
        assert again.grant.kind is GrantKind.FORWARD
        # The timed-out turn may or may not have run when the server woke up: it is never
        # retried, so it counts at most once.
        assert again.grant.turn in (2, 3)
    finally:
        server.resume()
        await store.close()


async def test_a_settle_sent_as_redis_goes_down_is_reported_not_lost_silently(
        server: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    """A settle and a turn log append are sent without the request waiting on them: when
    Redis is gone, the settle's awaiter gets StoreUnavailable (the proxy logs it) and the
    append is logged; neither is retried (either may have run)."""
    store = RedisStore(server.url, prefix="late")
    turns = RedisTurnLog(store, 60)
    eid = "ep-late"
    try:
        first = await store.open_turn(eid, lambda: fresh(eid), "a", time.time(),
                                      free_retries=0, message_count=1, disclosure_index=None)
        server.stop()
        closing = store.close_turn(eid, first.grant, SettleResult.OK, time.time(),
                                   count_failed=False)
        with caplog.at_level(logging.WARNING, logger="budgetproxy"):
            await turns.append(eid, BytesEntry(b'{"turn":1}', b"{}"))
            with pytest.raises(StoreUnavailable):
                await closing
            await asyncio.sleep(0)
        assert f"a turn of {eid} not kept for its trajectory" in caplog.text
        server.start()
        st = await store.get(eid)  # the store recovers; that turn stays in flight until the
        assert st is not None and st.inflight == 1  # idle sweep ends the episode
        assert await turns.read(eid) is None
    finally:
        await store.close()


async def test_scripts_flushed_while_running_are_loaded_again(server: RedisServer) -> None:
    store = RedisStore(server.url, prefix="flush")
    admin = redis.Redis(port=server.port)
    try:
        for round_ in range(3):
            admin.script_flush()
            eids = [f"e{round_}-{i}" for i in range(4)]
            opened = await asyncio.gather(*(
                store.open_turn(e, lambda e=e: fresh(e), "x", time.time(), free_retries=0,
                                message_count=1, disclosure_index=None) for e in eids))
            assert all(o.created and o.grant.kind is GrantKind.FORWARD for o in opened)
            admin.script_flush()
            assert await store.create(fresh(f"made-{round_}"))
            admin.script_flush()
            ended = await store.expire_idle(time.time() + 100, 1, 1)
            assert {s.episode_id for s in ended} == {*eids, f"made-{round_}"}
    finally:
        admin.close()
        await store.close()


def _config(tmp_path: Path, name: str, fake: FakeUpstream, server: RedisServer,
            policy: str) -> Path:
    return write_config(
        tmp_path / f"{name}.yaml", fake.base_url,
        store={"kind": "redis", "url": server.url, "on_unavailable": policy},
        trajectories={"dir": str(tmp_path / f"traj-{name}")},
    )


def _call(proxy: ProxyProcess, eid: str, text: str) -> httpx.Response:
    return httpx.post(f"{proxy.base_url}/chat/completions", headers={"X-Episode-Id": eid},
                      json={"model": "fake-model", "messages": [{"role": "user",
                                                                 "content": text}]},
                      timeout=20)


def _wait_ready(proxy: ProxyProcess, status: int, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while httpx.get(f"{proxy.url}/readyz", timeout=5).status_code != status:
        assert time.monotonic() < deadline, f"/readyz never answered {status}"
        time.sleep(0.1)


def test_fail_closed_answers_503_then_resumes(
    tmp_path: Path, fake: FakeUpstream, server: RedisServer
) -> None:
    proxy = ProxyProcess(_config(tmp_path, "closed", fake, server, "fail_closed"),
                         tmp_path / "closed.log")
    eid = f"closed-{uuid.uuid4().hex[:8]}"
    with proxy:
        client = openai.OpenAI(base_url=proxy.base_url, api_key="sk-test", max_retries=0)
        client.chat.completions.create(model="fake-model",
                                       messages=[{"role": "user", "content": "one"}],
                                       extra_headers={"X-Episode-Id": eid})
        _wait_ready(proxy, 200)
        server.stop()
        before = fake.count()
        with pytest.raises(openai.APIStatusError) as err:
            client.chat.completions.create(model="fake-model",
                                           messages=[{"role": "user", "content": "two"}],
                                           extra_headers={"X-Episode-Id": eid})
        assert err.value.status_code == 503
        body = err.value.body
        assert isinstance(body, dict) and body["code"] == "store_unavailable"
        assert fake.count() == before  # nothing went upstream
        _wait_ready(proxy, 503)
        assert httpx.get(f"{proxy.url}/v1/episodes/{eid}").status_code == 503

        server.start()
        _wait_ready(proxy, 200)
        r = _call(proxy, eid, "three")
        assert r.status_code == 200, r.text
        assert r.headers["x-episode-turn"] == "2"  # the refused call spent nothing
        client.close()


def test_fail_open_forwards_and_counts_then_resumes(
    tmp_path: Path, fake: FakeUpstream, server: RedisServer
) -> None:
    proxy = ProxyProcess(_config(tmp_path, "open", fake, server, "fail_open"),
                         tmp_path / "open.log")
    eid = f"open-{uuid.uuid4().hex[:8]}"
    with proxy:
        assert _call(proxy, eid, "one").status_code == 200
        server.stop()
        before = fake.count()
        for i in range(3):
            r = _call(proxy, eid, f"down {i}")
            assert r.status_code == 200, r.text
        assert fake.count() == before + 3
        text = httpx.get(f"{proxy.url}/metrics").text
        assert metric_total(text, "budgetproxy_store_unavailable_total",
                            policy="fail_open") == 3
        # the operator's log says so, once for the three calls, not once per call
        said = (tmp_path / "open.log").read_text().count("episode store unavailable")
        assert said == 1, (tmp_path / "open.log").read_text()
        # still ready (a load balancer keeps routing here, as fail_open asks), and it says
        # what is missing, in the body and a metric
        ready = httpx.get(f"{proxy.url}/readyz", timeout=5)
        assert ready.status_code == 200 and ready.json()["status"] == "degraded", ready.text
        text = httpx.get(f"{proxy.url}/metrics").text
        assert metric_total(text, "budgetproxy_store_degraded") == 1

        server.start()
        deadline = time.monotonic() + 15
        while httpx.get(f"{proxy.url}/readyz", timeout=5).json()["status"] != "ready":
            assert time.monotonic() < deadline, "/readyz never said ready again"
            time.sleep(0.1)
        text = httpx.get(f"{proxy.url}/metrics").text
        assert metric_total(text, "budgetproxy_store_degraded") == 0
        r = _call(proxy, eid, "two")
        assert r.status_code == 200 and r.headers["x-episode-turn"] == "2"


async def test_a_reserve_redis_runs_after_its_caller_gave_up_takes_no_turn(
        server: RedisServer) -> None:
    """Redis stalled past the store's socket timeout (a 503 to the caller), then woke and
    ran the queued script: it must not reserve the turn (charged, and in flight for good)."""
    import os
    import signal

    store = RedisStore(server.url, prefix="late", socket_timeout_s=0.5)
    eid = "ep-late"
    try:
        await store.expire_idle(time.time(), 3600, 60)  # the sweep reads Redis's clock
        first = await store.open_turn(eid, lambda: fresh(eid), "a", time.time(), free_retries=0,
                                      message_count=1, disclosure_index=None)
        await store.close_turn(eid, first.grant, SettleResult.OK, time.time(),
                               count_failed=False)
        assert server.proc is not None
        os.kill(server.proc.pid, signal.SIGSTOP)
        try:
            with pytest.raises(StoreUnavailable):
                await store.open_turn(eid, lambda: fresh(eid), "b", time.time(),
                                      free_retries=0, message_count=1, disclosure_index=None)
            await asyncio.sleep(0.3)  # past the deadline the script carries
        finally:
            os.kill(server.proc.pid, signal.SIGCONT)
        await asyncio.sleep(0.3)  # the queued script runs now
        st = await store.get(eid)
        assert st is not None and (st.turns_used, st.inflight) == (1, 0)
        again = await store.open_turn(eid, lambda: fresh(eid), "c", time.time(),
                                      free_retries=0, message_count=1, disclosure_index=None)
        assert again.grant.kind is GrantKind.FORWARD and again.grant.turn == 2
    finally:
        await store.close()
