"""The Redis store against a real Redis: the Lua scripts mirror the pure core, atomically."""

from __future__ import annotations

import asyncio
import copy
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import fields, replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from records_support import BytesEntry
from redis_support import REDIS_URL, drop_prefix, new_prefix, require_redis

from budgetproxy.core.episode import (
    EpisodeState,
    FinishStatus,
    Grant,
    GrantKind,
    Known,
    OutcomeReport,
    SettleResult,
    finish,
    reserve,
    settle,
)
from budgetproxy.store.base import StoreUnavailable
from budgetproxy.store.redis import RedisStore, decode_state, encode_state
from budgetproxy.store.redis_codec import _CODEC, _NO_AXES

pytestmark = pytest.mark.redis

T0 = 1_764_500_000.123456


@pytest.fixture(scope="module")
def prefix() -> Iterator[str]:
    require_redis()
    p = new_prefix()
    yield p
    drop_prefix(p)


@pytest.fixture
async def store(prefix: str) -> AsyncIterator[RedisStore]:
    s = RedisStore(REDIS_URL, prefix=prefix)
    yield s
    await s.close()


def episode(eid: str, budget: int = 3, **kw: Any) -> EpisodeState:
    kw.setdefault("created_at", T0)
    kw.setdefault("last_activity", kw["created_at"])
    return EpisodeState(episode_id=eid, budget=budget, max_turns=kw.pop("max_turns", 10),
                        disclosure=kw.pop("disclosure", "hidden"), **kw)


def new_eid() -> str:
    return f"ep-{uuid.uuid4().hex[:12]}"


async def open_(s: RedisStore, eid: str, fresh: Callable[[], EpisodeState], body: str,
                now: float, free_retries: int = 2) -> Any:
    return await s.open_turn(eid, fresh, body, now, free_retries=free_retries, message_count=1,
                             disclosure_index=None)


# -- the codec -----------------------------------------------------------------------------------
def test_every_episode_field_has_a_codec() -> None:
    names = {f.name for f in fields(EpisodeState)}
    assert names == set(_CODEC)
    flat = [v if isinstance(v, str) else v.decode() for v in encode_state(episode("e"))]
    decoded = decode_state(flat)
    # decode sets every field itself, but for the axis fields of a turn-only episode
    # (docs/budgets.md), which keep the class defaults without a write each
    # and for an episode in no live experiment (its experiment and arm)
    left = names - set(vars(decoded))
    assert left == set(_NO_AXES) | {"told", "experiment", "arm"}
    assert all(getattr(decoded, n) == getattr(EpisodeState, n) for n in left)
    axis_ep = episode("e", token_budget=5, experiment="x", arm="a")
    flat = [v if isinstance(v, str) else v.decode() for v in encode_state(axis_ep)]
    decoded = decode_state(flat)
    assert set(vars(decoded)) == names
    assert (decoded.experiment, decoded.arm) == ("x", "a")


def _states() -> st.SearchStrategy[EpisodeState]:
    ints = st.integers(0, 10**9)
    opt_text = st.none() | st.text(max_size=8)
    floats = st.floats(allow_nan=False, allow_infinity=False)
    json_value = st.none() | st.booleans() | st.integers(-5, 5) | st.text(max_size=5)
    return st.builds(
        EpisodeState,
        episode_id=st.text(min_size=1, max_size=12),
        budget=ints,
        max_turns=st.none() | ints,
        disclosure=st.sampled_from(["hidden", "disclosed"]),
        task_id=opt_text,
        group=opt_text,
        announced_budget=st.none() | ints,
        min_turns=st.none() | ints,
        tags=st.dictionaries(st.text(max_size=4), json_value, max_size=3),
        created_at=floats,
        last_activity=floats,
        model=opt_text,
        turns_used=ints,
        inflight=ints,
        last_turn=ints,
        last_attempt=ints,
        last_hash=st.none() | st.text(min_size=1, max_size=32),
        last_state=st.sampled_from(["none", "inflight", "charged", "refunded"]),
        last_charged=st.booleans(),
        free_retries_used=ints,
        refused=st.booleans(),
        disclosed_at=st.lists(st.tuples(ints, ints, ints, st.text(max_size=8)).map(list),
                              max_size=3),
        messages_seen=ints,
        messages_digest=st.none() | st.text(min_size=1, max_size=32),
        status=st.sampled_from(["active", "finished"]),
        outcome=st.none() | st.sampled_from(["success", "failure"]),
        success_turn=st.none() | ints,
        reward=st.none() | floats | st.integers(-3, 3),
        metadata=st.dictionaries(st.text(max_size=4), json_value, max_size=3),
        end_reason=st.none() | st.sampled_from(["success", "failure", "exhausted", "abandoned"]),
        ended_at=st.none() | floats,
        end_pending=st.booleans(),
        experiment=st.none() | st.text(min_size=1, max_size=8),
        arm=st.none() | st.text(min_size=1, max_size=8),
    )


@given(_states())
def test_codec_round_trips_every_state(state: EpisodeState) -> None:
    flat = [v if isinstance(v, str) else v.decode() for v in encode_state(state)]
    assert decode_state(flat) == state


# -- the differential property test --------------------------------------------------------------
_REPORTS = st.none() | st.builds(
    OutcomeReport,
    success=st.booleans(),
    reward=st.none() | st.floats(allow_nan=False, allow_infinity=False) | st.integers(-2, 2),
    success_turn=st.none() | st.integers(0, 6),
    metadata=st.dictionaries(st.sampled_from(["a", "b"]), st.integers(0, 3), max_size=2),
)
_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("reserve"), st.integers(0, 2), st.integers(0, 6),
                  st.none() | st.integers(0, 3), st.integers(0, 2),
                  st.none() | st.sampled_from(["m1", "m2"]),
                  st.none() | st.sampled_from(["d1", "d2"]), st.integers(0, 2)),
        st.tuples(st.just("settle"), st.integers(0, 9), st.sampled_from(list(SettleResult)),
                  st.booleans()),
        st.tuples(st.just("finish"), _REPORTS),
    ),
    max_size=30,
)
_EPISODES = st.builds(
    lambda budget, max_turns, arm, tags, task, model: episode(
        "", budget, max_turns=max_turns, disclosure=arm, tags=tags, task_id=task, model=model),
    st.integers(1, 6), st.none() | st.integers(6, 9), st.sampled_from(["hidden", "disclosed"]),
    st.dictionaries(st.sampled_from(["x", "y"]), st.integers(-(2**63), 2**63 - 1), max_size=2),
    st.none() | st.sampled_from(["t1", "t2"]),
    st.none() | st.just("m"),
)


@pytest.fixture(scope="module")
def loop_store(prefix: str) -> Iterator[tuple[asyncio.AbstractEventLoop, RedisStore]]:
    loop = asyncio.new_event_loop()
    s = RedisStore(REDIS_URL, prefix=prefix)
    yield loop, s
    loop.run_until_complete(s.close())
    loop.close()


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(initial=_EPISODES, ops=_OPS)
def test_lua_scripts_match_the_core(
    loop_store: tuple[asyncio.AbstractEventLoop, RedisStore],
    initial: EpisodeState,
    ops: list[tuple[Any, ...]],
) -> None:
    """Same inputs, same grants and states: reserve/settle/finish in Lua == core.episode."""
    loop, store = loop_store
    eid = new_eid()
    initial.episode_id = eid
    model: EpisodeState | None = None
    open_grants: list[Grant] = []

    def fresh() -> EpisodeState:
        return copy.deepcopy(initial)

    async def run() -> None:
        nonlocal model
        for step, op in enumerate(ops):
            now = T0 + 0.37 * (step + 1)
            if op[0] == "reserve":
                _, h, count, index, free, call_model, digest, told = op
                body = f"body-{h}"
                # what the caller holds of the placements: nothing, what they are, or stale
                entries = [] if model is None else model.disclosed_at
                known = Known(len(entries) + told - 1, entries[-1][3], ((9, 9),)) if (
                    told and entries) else None
                opened = await store.open_turn(eid, fresh, body, now, free_retries=free,
                                               message_count=count, disclosure_index=index,
                                               model=call_model, fingerprint=digest,
                                               placements_known=known)
                created = model is None
                if model is None:
                    model = fresh()
                grant = reserve(model, body, now, free_retries=free, message_count=count,
                                disclosure_index=index, model=call_model, fingerprint=digest,
                                placements_known=known)
                assert opened.grant == grant, (step, op)
                assert opened.created == created
                # (a turn's state leaves the placements out: `get` below has them)
                assert opened.state == replace(model, disclosed_at=[]), (step, op)
                if grant.kind is GrantKind.FORWARD:
                    open_grants.append(grant)
            elif op[0] == "settle":
                if not open_grants:
                    continue
                _, pick, result, count_failed = op
                grant = open_grants.pop(pick % len(open_grants))
                closed = await store.close_turn(eid, grant, result, now,
                                                count_failed=count_failed)
                assert model is not None
                pending = model.end_pending
                refunded = settle(model, grant, result, now, count_failed=count_failed)
                assert closed.refunded == refunded
                assert closed.ended == (pending and not model.end_pending), (step, op)
                # a snapshot only with the ending it hands back (turn-only calls)
                assert closed.state == (model if closed.ended else None), (step, op)
            else:
                report = op[1]
                done = await store.finish(eid, report, now)
                if model is None:
                    assert done.status is None and done.state is None
                    continue
                assert done.status is finish(model, report, now), (step, op)
                assert done.state == model, (step, op)
            stored = await store.get(eid)
            assert stored == model, (step, op)

    loop.run_until_complete(run())


# -- episodes ------------------------------------------------------------------------------------
async def test_fresh_is_called_only_for_a_new_episode_and_may_raise(store: RedisStore) -> None:
    eid = new_eid()

    def bad() -> EpisodeState:
        raise ValueError("bad header")

    with pytest.raises(ValueError):
        await open_(store, eid, bad, "b1", T0)
    assert await store.get(eid) is None
    assert not await store.is_known(eid)
    first = await open_(store, eid, lambda: episode(eid), "b1", T0)
    assert first.created and first.grant.kind is GrantKind.FORWARD
    again = await open_(store, eid, bad, "b2", T0 + 1)  # exists: bad() is not called
    assert not again.created and again.grant.turn == 2


async def test_replicas_racing_to_create_agree(prefix: str) -> None:
    stores = [RedisStore(REDIS_URL, prefix=prefix) for _ in range(4)]
    eid = new_eid()
    calls = 0

    def fresh() -> EpisodeState:
        nonlocal calls
        calls += 1
        return episode(eid, budget=50)

    try:
        opened = await asyncio.gather(
            *(open_(stores[i % 4], eid, fresh, f"b{i}", T0) for i in range(24))
        )
    finally:
        for s in stores:
            await s.close()
    assert sum(o.created for o in opened) == 1
    assert sorted(o.grant.turn for o in opened) == list(range(1, 25))
    assert calls >= 1


async def test_an_episode_lost_from_redis_starts_again_under_concurrent_calls(
        prefix: str) -> None:
    """A replica that kept a turn-only episode's fixed fields, when Redis lost the episode (a
    restart without persistence): concurrent calls recreate it, each gets a whole answer and
    a turn of its own, none an error."""
    import redis.asyncio as aioredis

    s = RedisStore(REDIS_URL, prefix=prefix)
    raw = aioredis.Redis.from_url(REDIS_URL)
    try:
        for _ in range(5):
            eid = new_eid()
            first = await open_(s, eid, lambda eid=eid: episode(eid, budget=50), "b0", T0)
            assert first.grant.kind is GrantKind.FORWARD
            await raw.delete(*s._keys(eid))  # what a restart without persistence leaves
            opened = await asyncio.gather(*(open_(s, eid, lambda eid=eid: episode(
                eid, budget=50), f"b{i}", T0 + 1) for i in range(1, 5)))
            assert all(o.grant.kind is GrantKind.FORWARD for o in opened)
            assert sorted(o.grant.turn for o in opened) == [1, 2, 3, 4]
            assert all(o.state.budget == 50 for o in opened)
    finally:
        await s.close()
        await raw.aclose()


async def test_create_get_and_duplicates(store: RedisStore) -> None:
    eid = new_eid()
    ep = episode(eid, budget=4, tags={"k": [1, 2]}, task_id="t", group="g", announced_budget=8)
    assert await store.create(ep)
    assert not await store.create(episode(eid))
    assert await store.get(eid) == ep
    assert await store.is_known(eid)
    assert await store.get(new_eid()) is None


async def test_finish_reports_and_conflicts(store: RedisStore) -> None:
    eid = new_eid()
    await store.create(episode(eid, budget=2))
    opened = await open_(store, eid, lambda: episode(eid), "b", T0 + 1)
    await store.close_turn(eid, opened.grant, SettleResult.OK, T0 + 2, count_failed=False)
    done = await store.finish(eid, OutcomeReport(True, reward=0.5), T0 + 3)
    assert done.status is FinishStatus.FINISHED
    assert done.state is not None
    assert (done.state.end_reason, done.state.success_turn, done.state.reward) == (
        "success", 1, 0.5)
    assert (await store.finish(eid, OutcomeReport(True, reward=0.5), T0 + 4)).status is (
        FinishStatus.SAME)
    assert (await store.finish(eid, OutcomeReport(False), T0 + 4)).status is (
        FinishStatus.CONFLICT)
    assert (await store.finish(eid, None, T0 + 4)).status is FinishStatus.SAME
    late = await open_(store, eid, lambda: episode(eid), "c", T0 + 5)
    assert late.grant.kind is GrantKind.FINISHED
    assert (await store.finish(new_eid(), None, T0)).status is None


async def test_finish_is_finished_exactly_once_across_replicas(prefix: str) -> None:
    stores = [RedisStore(REDIS_URL, prefix=prefix) for _ in range(3)]
    eids = [new_eid() for _ in range(10)]
    try:
        for eid in eids:
            await stores[0].create(episode(eid))
        results = await asyncio.gather(
            *(stores[i % 3].finish(eid, None if i % 2 else OutcomeReport(True), T0)
              for eid in eids for i in range(9))
        )
    finally:
        for s in stores:
            await s.close()
    finished = [r for r in results if r.status is FinishStatus.FINISHED]
    assert sorted(r.state.episode_id for r in finished if r.state) == sorted(eids)


async def test_finished_episode_leaves_its_id_after_retention(prefix: str) -> None:
    store = RedisStore(REDIS_URL, prefix=prefix, retention_s=0.2, idle_timeout_s=0.5)
    eid = new_eid()
    try:
        opened = await open_(store, eid, lambda: episode(eid), "b", T0)
        await store.finish(eid, None, T0 + 1)
        # its turn still in flight: kept (as an active episode is) until that turn settles
        await asyncio.sleep(0.4)
        assert (await store.get(eid)) is not None
        closed = await store.close_turn(eid, opened.grant, SettleResult.OK, T0 + 1.5,
                                        count_failed=False)
        assert closed.ended
        await asyncio.sleep(0.4)  # then retention runs from there
        assert await store.get(eid) is None
        assert await store.is_known(eid)
        late = await open_(store, eid, lambda: episode(eid), "b2", T0 + 2)
        assert late.grant.kind is GrantKind.FINISHED and not late.created
        assert late.state.status == "finished"
        assert not await store.create(episode(eid))
        done = await store.finish(eid, None, T0 + 3)
        assert done.status is None  # the API answers from is_known
    finally:
        await store.close()


async def test_finish_all_active_leaves_shared_episodes_alone(store: RedisStore) -> None:
    eid = new_eid()
    await open_(store, eid, lambda: episode(eid), "b", T0)
    assert await store.finish_all_active(T0 + 1) == []
    got = await store.get(eid)
    assert got is not None and got.status == "active"


# -- idle expiry ---------------------------------------------------------------------------------
async def test_an_episode_its_first_call_creates_is_indexed_and_swept_when_idle() -> None:
    """The first call's turn creates the episode and indexes it for the idle sweep in the
    same write (the pipelined connection): an episode that then goes quiet is ended."""
    require_redis()
    s = RedisStore(REDIS_URL, prefix=new_prefix())
    try:
        now = time.time()
        eid = new_eid()
        opened = await open_(s, eid, lambda: episode(eid, created_at=now - 100), "b", now - 100)
        assert opened.created
        await s.close_turn(eid, opened.grant, SettleResult.OK, now - 100, count_failed=False)
        assert await s.active_count() == 1
        assert [st.episode_id for st in await s.expire_idle(now, 30, 60)] == [eid]
        assert await s.active_count() == 0
    finally:
        await s.close()


async def test_idle_expiry_fires_once_across_replicas() -> None:
    require_redis()
    prefix = new_prefix()  # its own index: other tests' episodes are not swept here
    stores = [RedisStore(REDIS_URL, prefix=prefix) for _ in range(3)]
    try:
        now = time.time()
        idle = [new_eid() for _ in range(300)]
        for eid in idle:
            await stores[0].create(episode(eid, created_at=now - 100))
        busy, recent = new_eid(), new_eid()
        await stores[0].create(episode(busy, created_at=now - 100))
        await stores[0].create(episode(recent, created_at=now - 100))
        held = await open_(stores[1], busy, lambda: episode(busy), "b", now - 50)
        used = await open_(stores[1], recent, lambda: episode(recent), "b", now - 1)
        await stores[0].close_turn(recent, used.grant, SettleResult.OK, now - 1,
                                   count_failed=False)
        assert await stores[0].active_count() == 302

        rounds = await asyncio.gather(*(s.expire_idle(now, 30, 60) for s in stores))
        ended = [st.episode_id for r in rounds for st in r]
        assert sorted(ended) == sorted(idle)  # each once, by whichever replica claimed it
        assert all(st.end_reason == "abandoned" for r in rounds for st in r)
        assert await stores[0].active_count() == 2
        # the recent one was re-scored to its real last activity: not a candidate any more;
        # a turn in flight holds its episode, but not past twice the idle timeout
        assert await stores[0].expire_idle(now + 9, 30, 60) == []
        late = await stores[2].expire_idle(now + 15, 30, 60)
        assert [s.episode_id for s in late] == [busy]
        await stores[1].close_turn(busy, held.grant, SettleResult.OK, now + 16,
                                   count_failed=False)
        got = await stores[0].get(busy)
        assert got is not None and got.status == "finished"
        done = await stores[0].expire_idle(now + 100, 30, 60)
        assert [s.episode_id for s in done] == [recent]
        assert await stores[0].active_count() == 0
    finally:
        for s in stores:
            await s.close()
        drop_prefix(prefix)


async def test_an_ending_whose_turn_never_settles_is_recorded_within_one_idle_timeout(
) -> None:
    """Ended while a call was in flight on a replica that then died: nobody settles that
    call, and the sweep records the episode one idle timeout on (it waited two)."""
    prefix = new_prefix()
    store = RedisStore(REDIS_URL, prefix=prefix)
    try:
        eid = new_eid()
        await open_(store, eid, lambda: episode(eid), "b1", T0)
        done = await store.finish(eid, OutcomeReport(True), T0 + 1)
        assert done.state is not None and done.state.end_pending
        assert await store.expire_idle(T0 + 29, 30, 60) == []
        ended = await store.expire_idle(T0 + 31, 30, 60)
        assert [s.episode_id for s in ended] == [eid]
        assert ended[0].end_reason == "success" and not ended[0].end_pending
        got = await store.get(eid)
        assert got is not None and got.status == "finished" and not got.end_pending
        assert await store.expire_idle(T0 + 100, 30, 60) == []  # recorded once
    finally:
        await store.close()
        drop_prefix(prefix)


async def test_an_episode_in_flight_outlives_the_sweeps_claim_with_no_retention() -> None:
    """retention_s 0: the active key's TTL still reaches past the sweep that claims a turn
    in flight (twice the idle timeout, then a sweep), so the episode is ended, not lost."""
    import redis.asyncio as aioredis

    prefix = new_prefix()
    store = RedisStore(REDIS_URL, prefix=prefix, idle_timeout_s=1.0, retention_s=0.0,
                       sweep_interval_s=0.5)
    raw = aioredis.Redis.from_url(REDIS_URL)
    try:
        eid = new_eid()
        now = time.time()
        await open_(store, eid, lambda: episode(eid, created_at=now), "b1", now)
        await asyncio.sleep(2.3)  # past twice the idle timeout, the sweep's next turn
        assert await raw.exists(store.episode_key(eid)) == 1
        ended = await store.expire_idle(time.time(), 1.0, 0.0)
        assert [s.episode_id for s in ended] == [eid]
        assert (await open_(store, eid, lambda: episode(eid), "b2", time.time())
                ).grant.kind is GrantKind.FINISHED  # its id is not opened again
    finally:
        await store.close()
        await raw.aclose()
        drop_prefix(prefix)


async def test_a_first_call_refused_for_a_price_leaves_its_episode_a_ttl(
        store: RedisStore) -> None:
    import redis.asyncio as aioredis

    eid = new_eid()
    opened = await store.open_turn(eid, lambda: episode(eid, cost_budget=0.5), "b1", T0,
                                   free_retries=2, message_count=1, disclosure_index=None)
    assert opened.grant.kind is GrantKind.NEED_PRICE
    raw = aioredis.Redis.from_url(REDIS_URL)
    try:
        assert await raw.pttl(store.episode_key(eid)) > 0
    finally:
        await raw.aclose()


async def test_an_ending_waits_for_its_turns_in_flight(store: RedisStore) -> None:
    eid = new_eid()
    first = await open_(store, eid, lambda: episode(eid, budget=2), "b1", T0)
    await store.close_turn(eid, first.grant, SettleResult.OK, T0 + 1, count_failed=False)
    held = await open_(store, eid, lambda: episode(eid), "b2", T0 + 2)
    done = await store.finish(eid, OutcomeReport(True), T0 + 3)
    assert done.status is FinishStatus.FINISHED and done.state is not None
    assert done.state.end_pending and done.state.turns_used == 2  # provisional
    closed = await store.close_turn(eid, held.grant, SettleResult.REFUNDABLE, T0 + 4,
                                    count_failed=False)
    assert closed.ended and closed.refunded and closed.state is not None
    st = closed.state
    assert (st.turns_used, st.end_reason, st.success_turn, st.end_pending) == (
        1, "success", 2, False)
    assert st.settled_success_turn == 1  # the report is kept as sent; the record says 1
    assert (await store.finish(eid, OutcomeReport(True), T0 + 5)).status is FinishStatus.SAME


async def test_a_pending_ending_whose_turn_never_settles_is_claimed_by_a_sweep() -> None:
    """The replica serving the turn died: the ending is recorded by a sweep, once."""
    require_redis()
    prefix = new_prefix()
    stores = [RedisStore(REDIS_URL, prefix=prefix) for _ in range(2)]
    try:
        now = time.time()
        eid = new_eid()
        held = await open_(stores[0], eid, lambda: episode(eid, created_at=now - 100), "b",
                           now - 50)
        done = await stores[1].finish(eid, None, now - 40)
        assert done.state is not None and done.state.end_pending
        assert await stores[1].active_count() == 1  # still swept
        # already ended, idle past one idle timeout: claimed, though its turn is in flight
        claimed = await stores[1].expire_idle(now, 30, 60)
        assert [(s.episode_id, s.end_reason, s.end_pending) for s in claimed] == [
            (eid, "abandoned", False)]
        assert await stores[1].active_count() == 0
        late = await stores[0].close_turn(eid, held.grant, SettleResult.REFUNDABLE, now + 60,
                                          count_failed=False)
        assert not late.ended  # recorded already: its numbers stay as recorded
        assert late.state is None  # a turn-only call's settle answers its refund alone
        kept = await stores[0].get(eid)
        assert kept is not None and kept.turns_used == 1
    finally:
        for s in stores:
            await s.close()
        drop_prefix(prefix)


# -- concurrency ---------------------------------------------------------------------------------
@pytest.mark.parametrize("budget,calls", [(37, 200), (50, 20)])
async def test_reserve_never_overspends(prefix: str, budget: int, calls: int) -> None:
    """Many connections (replicas) reserving at once forward exactly min(calls, budget)."""
    stores = [RedisStore(REDIS_URL, prefix=prefix) for _ in range(4)]
    eid = new_eid()
    try:
        opened = await asyncio.gather(
            *(open_(stores[i % 4], eid, lambda: episode(eid, budget=budget), f"b{i}", T0)
              for i in range(calls))
        )
        st = await stores[0].get(eid)
    finally:
        for s in stores:
            await s.close()
    forwarded = [o for o in opened if o.grant.kind is GrantKind.FORWARD]
    assert len(forwarded) == min(calls, budget)
    assert sorted(o.grant.turn for o in forwarded) == list(range(1, len(forwarded) + 1))
    assert st is not None and st.turns_used == min(calls, budget)
    assert st.inflight == len(forwarded)


async def test_reserve_and_refunds_under_concurrency_stay_within_budget(prefix: str) -> None:
    """Interleaved reserves and refunding settles: charged turns never exceed the budget."""
    stores = [RedisStore(REDIS_URL, prefix=prefix) for _ in range(4)]
    eid, budget = new_eid(), 10
    charged = 0

    async def agent(i: int) -> None:
        nonlocal charged
        s = stores[i % 4]
        for j in range(15):
            o = await open_(s, eid, lambda: episode(eid, budget=budget), f"b{i}-{j}", T0)
            if o.grant.kind is not GrantKind.FORWARD:
                return
            ok = (i + j) % 3 != 0
            await s.close_turn(eid, o.grant, SettleResult.OK if ok else SettleResult.REFUNDABLE,
                               T0, count_failed=False)
            charged += ok

    try:
        await asyncio.gather(*(agent(i) for i in range(16)))
        st = await stores[0].get(eid)
    finally:
        for s in stores:
            await s.close()
    assert st is not None
    assert charged == st.turns_used == budget
    assert st.inflight == 0 and st.refused


async def test_placements_leave_the_older_versions_field_readable(store: RedisStore) -> None:
    """During a rolling deploy older replicas read `disclosed_at` as [index, turn] pairs (and
    need the field): placements with counts and digests live in a list of their own beside
    the hash, so an older replica serving a turn of a newer one's episode does not fail on
    them."""
    import redis as redis_sync

    raw = redis_sync.Redis.from_url(REDIS_URL, decode_responses=True)
    eid = new_eid()
    disclosed = lambda: episode(eid, disclosure="disclosed")  # noqa: E731
    opened = await store.open_turn(eid, disclosed, "b1", T0, free_retries=2, message_count=1,
                                   disclosure_index=0, fingerprint="5:abc")
    key, listed = store.episode_key(eid), store.placements_key(eid)
    assert raw.hget(key, "disclosed_at") == "[]" and not raw.hexists(key, "placements")
    assert raw.lrange(listed, 0, -1) == ['[0,1,1,"5:abc"]']
    await store.close_turn(eid, opened.grant, SettleResult.OK, T0 + 1, count_failed=False)
    # what an older replica leaves: its own pairs
    raw.hset(key, "disclosed_at", "[[0,1],[2,2]]")
    again = await store.open_turn(eid, disclosed, "b2", T0 + 2, free_retries=2,
                                  message_count=3, disclosure_index=2, fingerprint="9:def")
    assert again.grant.kind is GrantKind.FORWARD
    assert again.grant.disclosed_at.every == ((0, 1, 1, "5:abc"),)
    assert raw.hget(key, "disclosed_at") == "[[0,1],[2,2]]"
    assert raw.lrange(listed, 0, -1) == ['[0,1,1,"5:abc"]', '[2,2,3,"9:def"]']
    key_ttl = raw.pttl(key)  # (read first: both count down between the two reads)
    assert 0 < raw.pttl(listed) <= key_ttl
    raw.close()


async def test_placements_an_older_version_kept_in_the_hash_are_read(store: RedisStore) -> None:
    """An episode whose placements the previous version kept in the hash (`placements`, one
    JSON array): `get` reads them, the next turn is given them all and moves them to the
    list, placing its own as if the list had held them all along."""
    import redis as redis_sync

    raw = redis_sync.Redis.from_url(REDIS_URL, decode_responses=True)
    eid = new_eid()
    disclosed = lambda: episode(eid, budget=9, disclosure="disclosed")  # noqa: E731
    opened = await store.open_turn(eid, disclosed, "b1", T0, free_retries=2, message_count=2,
                                   disclosure_index=1, fingerprint="2:a")
    await store.close_turn(eid, opened.grant, SettleResult.OK, T0 + 1, count_failed=False)
    key, listed = store.episode_key(eid), store.placements_key(eid)
    raw.delete(listed)
    old = '[[1,1,2,"2:a"],[3,2,4,"4:b"],[5,3,6,"6:c"]]'
    raw.hset(key, mapping={"placements": old, "turns_used": 3, "last_turn": 3})
    stored = await store.get(eid)
    assert stored is not None
    assert stored.disclosed_at == [[1, 1, 2, "2:a"], [3, 2, 4, "4:b"], [5, 3, 6, "6:c"]]
    # a shorter conversation than turn 3's, at turn 2's index
    again = await store.open_turn(eid, disclosed, "b4", T0 + 2, free_retries=2,
                                  message_count=5, disclosure_index=3, fingerprint="5:d")
    assert again.grant.kind is GrantKind.FORWARD and again.grant.turn == 4
    assert again.grant.disclosed_at.every == ((1, 1, 2, "2:a"), (3, 2, 4, "4:b"),
                                              (5, 3, 6, "6:c"))
    assert not raw.hexists(key, "placements")
    assert raw.lrange(listed, 0, -1) == ['[1,1,2,"2:a"]', '[3,4,5,"5:d"]']
    await store.finish(eid, None, T0 + 3)
    assert not raw.exists(listed)  # an ended episode opens no turn again
    raw.close()


async def test_a_turn_s_reply_and_the_episode_hash_do_not_grow_with_its_turns(
        store: RedisStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """A disclosed episode's turns, told what the caller holds (as the proxy does once it has
    answered the episode's previous turn): each reply, and the hash every reply may read,
    weigh the same bytes at turn 300 as at turn 10; only the list beside it grows."""
    import redis as redis_sync

    import budgetproxy.store.redis as redis_store

    replies: list[int] = []
    real = redis_store._json

    def measured(raw: str | bytes) -> list[Any]:
        replies.append(len(raw))
        return real(raw)

    monkeypatch.setattr(redis_store, "_json", measured)
    raw = redis_sync.Redis.from_url(REDIS_URL, decode_responses=True)
    eid = new_eid()
    disclosed = lambda: episode(eid, budget=1000, disclosure="disclosed")  # noqa: E731
    known: Known | None = None
    sizes: dict[int, tuple[int, int]] = {}
    for turn in range(1, 301):
        count = 2 * turn
        digest = f"{1000 + count}:{turn:032x}"  # (the same width every turn)
        before = len(replies)
        opened = await store.open_turn(
            eid, disclosed, f"b{turn}", T0 + turn, free_retries=0, message_count=count,
            disclosure_index=count - 1, fingerprint=digest, placements_known=known)
        assert opened.grant.kind is GrantKind.FORWARD
        assert (opened.grant.disclosed_at.every is None) == (known is not None)
        await store.close_turn(eid, opened.grant, SettleResult.OK, T0 + turn,
                               count_failed=False)
        known = Known(turn, digest, ())
        hash_bytes = sum(len(k) + len(v) for k, v in raw.hgetall(store.episode_key(eid)).items())
        sizes[turn] = (sum(replies[before:]), hash_bytes)
    assert raw.llen(store.placements_key(eid)) == 300
    # numbers gain a digit or two (turns, counts); nothing else may grow
    assert sizes[300][0] - sizes[10][0] <= 12, sizes
    assert sizes[300][1] - sizes[10][1] <= 12, sizes
    raw.close()


async def test_turns_of_a_known_episode_are_answered_with_their_changes_alone(
        store: RedisStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """After its first turn, a turn-only episode's turns come back as what each changed
    (no whole episode to decode) and read the same as the episode Redis holds; an episode
    that ended, or one on another axis, is answered whole."""
    import budgetproxy.store.redis as redis_store

    decoded: list[int] = []
    real = redis_store.decode_state

    def counting(pairs: list[str]) -> EpisodeState:
        decoded.append(1)
        return real(pairs)

    monkeypatch.setattr(redis_store, "decode_state", counting)
    eid = new_eid()
    fresh = lambda: episode(eid, budget=3, disclosure="disclosed", tags={"x": 1},  # noqa: E731
                            task_id="t")
    for turn in (1, 2, 3):
        before = len(decoded)
        opened = await store.open_turn(eid, fresh, f"b{turn}", T0 + turn, free_retries=2,
                                       message_count=2 * turn, disclosure_index=2 * turn - 1,
                                       model="m1", fingerprint=f"{turn}:abc")
        assert opened.grant.kind is GrantKind.FORWARD and opened.grant.turn == turn
        assert len(decoded) - before == (1 if turn == 1 else 0)
        stored = await store.get(eid)
        assert stored is not None and len(stored.disclosed_at) == turn
        assert opened.state == replace(stored, disclosed_at=[])
        assert opened.state.turns_used == turn and opened.state.model == "m1"
    refused = await store.open_turn(eid, fresh, "b4", T0 + 4, free_retries=2, message_count=8,
                                    disclosure_index=7)
    assert refused.grant.kind is GrantKind.EXHAUSTED and refused.state.refused
    await store.finish(eid, None, T0 + 5)
    ended = await store.open_turn(eid, fresh, "b5", T0 + 6, free_retries=2, message_count=9,
                                  disclosure_index=8)
    assert ended.grant.kind is GrantKind.FINISHED and eid not in store._fixed


# -- settles sent unawaited ----------------------------------------------------------------------
@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(plans=st.lists(st.lists(st.tuples(st.booleans(), st.integers(0, 3)), min_size=1,
                               max_size=8), min_size=2, max_size=6),
       budget=st.integers(1, 12))
async def test_settles_awaited_late_keep_budgets_exact(
        prefix: str, plans: list[list[tuple[bool, int]]], budget: int) -> None:
    """Agents on two replicas: each settle is sent when called and awaited only after a few
    loop turns (as the proxy awaits a turn-only call's settle after logging it). Charged turns
    never pass the budget and end as exactly the turns not given back."""
    stores = [RedisStore(REDIS_URL, prefix=prefix) for _ in range(2)]
    eid = new_eid()
    kept = 0
    peak = 0

    async def agent(i: int, plan: list[tuple[bool, int]]) -> None:
        nonlocal kept, peak
        s = stores[i % 2]
        for j, (ok, wait) in enumerate(plan):
            o = await open_(s, eid, lambda: episode(eid, budget=budget), f"b{i}-{j}", T0)
            if o.grant.kind is not GrantKind.FORWARD:
                return
            peak = max(peak, o.state.turns_used)
            closing = s.close_turn(eid, o.grant,
                                   SettleResult.OK if ok else SettleResult.REFUNDABLE, T0 + 1,
                                   count_failed=False)
            for _ in range(wait):
                await asyncio.sleep(0)
            closed = await closing
            assert closed.refunded is not ok and closed.state is None and not closed.ended
            kept += ok

    try:
        await asyncio.gather(*(agent(i, p) for i, p in enumerate(plans)))
        st_ = await stores[0].get(eid)
    finally:
        for s in stores:
            await s.close()
    assert st_ is not None and st_.inflight == 0
    assert peak <= budget
    assert st_.turns_used == kept <= budget


async def test_a_refund_sent_unawaited_lands_before_the_next_reserve(store: RedisStore) -> None:
    """One replica's scripts run in the order it sends them: a call reserved right after a
    refund was sent (not yet answered) finds the turn given back."""
    eid = new_eid()
    first = await open_(store, eid, lambda: episode(eid, budget=1), "b1", T0)
    refund = store.close_turn(eid, first.grant, SettleResult.REFUNDABLE, T0 + 1,
                              count_failed=False)
    assert not refund.done()
    again = await open_(store, eid, lambda: episode(eid, budget=1), "b2", T0 + 2)
    assert (await refund).refunded
    assert again.grant.kind is GrantKind.FORWARD and again.grant.turn == 1


async def test_close_sends_the_settles_and_turns_still_pending(prefix: str) -> None:
    from budgetproxy.store.turn_log import RedisTurnLog

    store = RedisStore(REDIS_URL, prefix=prefix)
    eid = new_eid()
    opened = await open_(store, eid, lambda: episode(eid), "b1", T0)
    closing = store.close_turn(eid, opened.grant, SettleResult.OK, T0 + 1, count_failed=False)
    await RedisTurnLog(store, 60).append(eid, BytesEntry(b'{"turn":1}', b"{}"))  # not awaited
    await store.close()  # at shutdown: nothing sent is dropped
    assert closing.done() and not (await closing).refunded
    with pytest.raises(StoreUnavailable):  # and nothing is sent after
        await store.close_turn(eid, opened.grant, SettleResult.OK, T0 + 2, count_failed=False)
    other = RedisStore(REDIS_URL, prefix=prefix)
    try:
        st_ = await other.get(eid)
        assert st_ is not None and (st_.inflight, st_.turns_used) == (0, 1)
        assert await RedisTurnLog(other, 60).read(eid) == [b'{"turn":1}']
    finally:
        await other.close()


async def test_a_burst_waits_for_a_connection_and_a_busy_pool_is_not_read_as_down(
        prefix: str) -> None:
    """More episodes created at once (POST /v1/episodes) than the pool has connections: each
    waits its turn. A pool whose connections all stay busy past the wait is StoreBusy
    (fail_open does not forward on it), not a down Redis. A model call's turn, its episode's
    creation included, goes on the pipelined connection and needs none of them."""
    from budgetproxy.store.base import StoreBusy

    s = RedisStore(REDIS_URL, prefix=prefix, max_connections=2, socket_timeout_s=0.5)
    try:
        ids = [new_eid() for _ in range(40)]
        created = await asyncio.gather(*(s.create(episode(e)) for e in ids))
        assert all(created)
        pool = s._redis.connection_pool
        held = [await pool.get_connection(), await pool.get_connection()]
        eid = new_eid()
        with pytest.raises(StoreBusy):
            await s.create(episode(eid))
        other = new_eid()
        assert (await open_(s, other, lambda: episode(other), "b", T0)).created
        for conn in held:
            await pool.release(conn)
        assert await s.create(episode(eid))
    finally:
        await s.close()
