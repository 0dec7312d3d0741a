"""Budgets beside turns in both stores: the Redis scripts give the core's numbers, atomically."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis_support import REDIS_URL, drop_prefix, new_prefix, require_redis

from budgetproxy.core import axes
from budgetproxy.core.axes import Spend
from budgetproxy.core.episode import EpisodeState, Grant, GrantKind, SettleResult
from budgetproxy.store.memory import MemoryStore
from budgetproxy.store.redis import RedisStore

pytestmark = pytest.mark.redis

T0 = 1_764_500_000.25
AXIS_FIELDS = ("tokens_used", "cost_used", "tokens_reserved", "cost_reserved", "first_call_at",
               "exhausted_by", "turns_used", "refused", "end_reason", "status")


@pytest.fixture(scope="module")
def prefix() -> Iterator[str]:
    require_redis()
    p = new_prefix()
    yield p
    drop_prefix(p)


@pytest.fixture
async def redis_store(prefix: str) -> AsyncIterator[RedisStore]:
    s = RedisStore(REDIS_URL, prefix=prefix)
    yield s
    await s.close()


def _fresh(eid: str, **kw: object) -> EpisodeState:
    return EpisodeState(episode_id=eid, budget=50, max_turns=None, disclosure="hidden",
                        created_at=T0, last_activity=T0, **kw)  # type: ignore[arg-type]


async def _open(store: MemoryStore | RedisStore, eid: str, h: str, now: float,
                cap: int | None, rate: float | None, **kw: object) -> Grant:
    opened = await store.open_turn(eid, lambda: _fresh(eid, **kw), h, now, free_retries=0,
                                   message_count=1, disclosure_index=None, client_cap=cap,
                                   out_rate=rate, output_hold=120)
    return opened.grant


_ops = st.lists(st.tuples(st.booleans(), st.none() | st.integers(1, 300), st.integers(0, 200),
                          st.sampled_from(["ok", "refundable", "none"]), st.floats(0, 30)),
                min_size=1, max_size=25)


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=_ops, tb=st.none() | st.integers(1, 2000), cb=st.none() | st.floats(1e-4, 2e-3),
       timeb=st.none() | st.floats(5, 200))
async def test_redis_matches_the_core(redis_store: RedisStore, ops: list[tuple[object, ...]],
                                      tb: int | None, cb: float | None,
                                      timeb: float | None) -> None:
    mem = MemoryStore()
    eid = f"ax-{uuid.uuid4().hex[:10]}"
    kw = {"token_budget": tb, "cost_budget": cb, "time_budget_s": timeb}
    held: dict[str, list[Grant]] = {"m": [], "r": []}
    now = T0
    for i, (settle_first, cap, tin, how, dt) in enumerate(ops):
        assert isinstance(dt, float) and isinstance(tin, int)
        now += dt
        if settle_first and held["m"]:
            gm, gr = held["m"].pop(0), held["r"].pop(0)
            result = SettleResult.REFUNDABLE if how == "refundable" else SettleResult.OK
            spend = None if how == "none" else Spend(tin + 7, (tin + 7) * 1e-6)
            cm = await mem.close_turn(eid, gm, result, now, count_failed=False, spend=spend)
            cr = await redis_store.close_turn(eid, gr, result, now, count_failed=False,
                                              spend=spend)
            # a turn-only call's settle answers its refund alone; one holding axes, the
            # episode's spend after it, as a turn record gives it
            assert (cr.spent is None) == (gr.hold is None)
            assert (cm.spent is None) == (gm.hold is None)
            sm, sr = await mem.get(eid), await redis_store.get(eid)
            assert sm is not None and sr is not None and cr.refunded == cm.refunded
            if cm.spent is not None:
                assert cm.spent == axes.cumulative(sm, now)
                assert cr.spent == pytest.approx(cm.spent)
            for f in AXIS_FIELDS:
                assert getattr(sm, f) == pytest.approx(getattr(sr, f)), f
            continue
        c = cap if isinstance(cap, int) else None
        gm = await _open(mem, eid, f"h{i}", now, c, 1e-6, **kw)
        gr = await _open(redis_store, eid, f"h{i}", now, c, 1e-6, **kw)
        assert (gm.kind, gm.turn, gm.hold) == (gr.kind, gr.turn, gr.hold)
        if gm.kind is GrantKind.FORWARD:
            held["m"].append(gm)
            held["r"].append(gr)
        sm, sr = await mem.get(eid), await redis_store.get(eid)
        assert sm is not None and sr is not None
        for f in AXIS_FIELDS:
            assert getattr(sm, f) == getattr(sr, f), f


async def test_a_cost_budget_asks_for_the_price_first(redis_store: RedisStore) -> None:
    for store in (MemoryStore(), redis_store):
        eid = f"ax-{uuid.uuid4().hex[:10]}"
        g = await _open(store, eid, "h", T0, 100, None, cost_budget=0.01)
        assert g.kind is GrantKind.NEED_PRICE
        g = await _open(store, eid, "h", T0, 100, 2e-5, cost_budget=0.01)
        assert g.kind is GrantKind.FORWARD and g.hold is not None
        assert g.hold.cap is None and g.hold.tokens == 100  # $0.01 buys 500: the client's 100
        st = await store.get(eid)
        assert st is not None and st.cost_reserved == pytest.approx(0.002)


async def test_two_replicas_never_jointly_overspend(prefix: str) -> None:
    """Two stores on one Redis (two replicas), many concurrent calls: outputs stay within."""
    a, b = RedisStore(REDIS_URL, prefix=prefix), RedisStore(REDIS_URL, prefix=prefix)
    eid = f"ax-{uuid.uuid4().hex[:10]}"
    out_total = 0

    async def agent(store: RedisStore, n: int) -> None:
        nonlocal out_total
        for k in range(n):
            g = await _open(store, eid, f"{id(store)}-{k}", T0, 64, None, token_budget=1000)
            if g.kind is GrantKind.HELD:
                await asyncio.sleep(0.001)  # what is left is held: wait for a settle
                continue
            if g.kind is not GrantKind.FORWARD:
                return
            assert g.hold is not None
            sent = g.hold.cap if g.hold.cap is not None else 64
            await asyncio.sleep(0)
            out_total += sent
            await store.close_turn(eid, g, SettleResult.OK, T0, count_failed=False,
                                   spend=Spend(10 + sent))
    try:
        await asyncio.gather(*(agent(s, 40) for s in (a, b) for _ in range(4)))
        st = await a.get(eid)
        assert st is not None
        assert out_total <= 1000 and st.exhausted_by == "tokens"
        assert st.tokens_reserved == 0 and st.tokens_used >= 1000
    finally:
        await a.close()
        await b.close()
