"""The memory store stays bounded by the episode rate: compacted, then forgotten, then gone."""

from __future__ import annotations

from budgetproxy.core.episode import EpisodeState, GrantKind, OutcomeReport, SettleResult
from budgetproxy.store.memory import ForgottenIds, MemoryStore


def _fresh(eid: str, now: float = 0.0) -> EpisodeState:
    return EpisodeState(episode_id=eid, budget=5, max_turns=10, disclosure="disclosed",
                        created_at=now, last_activity=now)


async def _turn(store: MemoryStore, eid: str, now: float) -> None:
    opened = await store.open_turn(eid, lambda: _fresh(eid, now), f"h{now}", now,
                                   free_retries=2, message_count=3, disclosure_index=2)
    await store.close_turn(eid, opened.grant, SettleResult.OK, now, count_failed=False)


async def test_finished_episodes_are_compacted_then_forgotten_then_dropped() -> None:
    store = MemoryStore(remember_s=100)
    await _turn(store, "a", 1.0)
    done = await store.finish("a", OutcomeReport(True, metadata={"big": "x" * 1000}), 2.0)
    assert done.state is not None and done.state.metadata == {"big": "x" * 1000}  # for the log
    kept = await store.get("a")
    assert kept is not None and kept.status == "finished" and kept.outcome == "success"
    assert (kept.disclosed_at, kept.last_hash, kept.metadata) == ([], None, {})
    assert await store.active_count() == 0
    # the same report again is still recognised after compaction
    again = await store.finish("a", OutcomeReport(True), 3.0)
    assert again.status is not None and again.status.value == "same"

    await store.expire_idle(now=50.0, idle_timeout_s=1000, retention_s=10)
    assert await store.get("a") is None and await store.is_known("a")
    refused = await store.open_turn("a", lambda: _fresh("a"), "h", 51.0, free_retries=2,
                                    message_count=1, disclosure_index=None)
    assert refused.grant.kind is GrantKind.FINISHED

    await store.expire_idle(now=200.0, idle_timeout_s=1000, retention_s=10)
    assert not await store.is_known("a")  # past remember_s the id may be used again


async def test_sweep_ends_idle_episodes_once_and_keeps_busy_ones() -> None:
    store = MemoryStore()
    for i, eid in enumerate(["idle", "recent"]):
        await _turn(store, eid, float(i * 50))
    busy = await store.open_turn("busy", lambda: _fresh("busy"), "h", 0.0, free_retries=2,
                                 message_count=1, disclosure_index=None)
    assert busy.grant.kind is GrantKind.FORWARD
    ended = await store.expire_idle(now=60.0, idle_timeout_s=30, retention_s=1000)
    assert [s.episode_id for s in ended] == ["idle"]
    assert ended[0].end_reason == "abandoned"
    assert await store.expire_idle(now=61.0, idle_timeout_s=30, retention_s=1000) == []
    assert await store.active_count() == 2


def test_forgotten_ids_are_remembered_for_remember_s() -> None:
    ids = ForgottenIds(remember_s=300.0)  # slices of 10 s
    for t in range(0, 100):  # one id a second for 100 s
        ids.add(f"episode-{t}", float(t))
        ids.expire(float(t))
    assert all(f"episode-{t}" in ids for t in range(100))
    assert "episode-100" not in ids and "never-seen" not in ids and 7 not in ids
    assert len(ids) == 100
    ids.expire(350.0)  # ids 0..49 are past 300 s (whole slices go, never a younger one)
    assert all(f"episode-{t}" in ids for t in range(50, 100))
    assert "episode-0" not in ids and "episode-39" not in ids
    ids.expire(400.0)
    assert len(ids) == 0 and "episode-99" not in ids


def test_forgotten_ids_are_capped_oldest_first() -> None:
    ids = ForgottenIds(remember_s=1e9, max_ids=3000)  # slices of at most 100 ids
    for i in range(10_000):
        ids.add(f"e{i}", float(i))
        if i % 500 == 0:
            ids.expire(float(i))
    ids.expire(10_000.0)
    assert 2900 <= len(ids) <= 3000
    assert all(f"e{i}" in ids for i in range(7100, 10_000))  # the newest are all there
    assert "e0" not in ids and "e6000" not in ids


async def test_many_forgotten_episodes_stay_remembered() -> None:
    store = MemoryStore(remember_s=86400)
    for i in range(20_000):
        eid = f"bulk-{i:06d}"
        await _turn(store, eid, float(i) / 100)
        await store.finish(eid, OutcomeReport(True), float(i) / 100)
    await store.expire_idle(now=1000.0, idle_timeout_s=10_000, retention_s=1)
    assert await store.get("bulk-000123") is None
    assert await store.is_known("bulk-000123") and await store.is_known("bulk-019999")
    assert not await store.is_known("bulk-020000")
    assert len(store._forgotten) == 20_000


async def test_an_episode_ended_with_a_turn_in_flight_ends_when_the_turn_settles() -> None:
    store = MemoryStore()
    await _turn(store, "e", 1.0)
    held = await store.open_turn("e", lambda: _fresh("e"), "h2", 2.0, free_retries=2,
                                 message_count=5, disclosure_index=4)
    done = await store.finish("e", OutcomeReport(False), 3.0)
    assert done.state is not None and done.state.end_pending  # recorded by the settle
    assert await store.active_count() == 1  # kept whole (its record needs it) until then
    late = await store.open_turn("e", lambda: _fresh("e"), "h3", 3.5, free_retries=2,
                                 message_count=1, disclosure_index=None)
    assert late.grant.kind is GrantKind.FINISHED
    closed = await store.close_turn("e", held.grant, SettleResult.REFUNDABLE, 4.0,
                                    count_failed=False)
    assert closed.ended and closed.refunded and closed.state is not None
    assert (closed.state.turns_used, closed.state.end_reason) == (1, "failure")
    assert not closed.state.end_pending and await store.active_count() == 0


async def test_shutdown_records_an_ending_still_waiting_for_its_turns() -> None:
    store = MemoryStore()
    held = await store.open_turn("w", lambda: _fresh("w"), "h", 1.0, free_retries=2,
                                 message_count=1, disclosure_index=None)
    await store.finish("w", None, 2.0)
    busy = await store.open_turn("b", lambda: _fresh("b"), "h", 1.0, free_retries=2,
                                 message_count=1, disclosure_index=None)
    ended = await store.finish_all_active(3.0)
    assert sorted((s.episode_id, s.end_pending) for s in ended) == [("b", False), ("w", False)]
    # their turns settling later record nothing more
    for eid, opened in (("w", held), ("b", busy)):
        closed = await store.close_turn(eid, opened.grant, SettleResult.REFUNDABLE, 4.0,
                                        count_failed=False)
        assert not closed.ended and closed.state is None  # a turn-only call's: no snapshot
        after = await store.get(eid)
        assert after is not None and after.turns_used == 1


async def test_max_retained_evicts_the_oldest_whose_ids_keep_refusing_calls() -> None:
    store = MemoryStore(remember_s=1000, max_retained=2)
    for i, eid in enumerate(["a", "b", "c"]):
        await _turn(store, eid, float(i))
        await store.finish(eid, None, float(i) + 0.5)
    assert store.evicted == 1
    assert await store.get("a") is None and await store.is_known("a")
    assert (await store.get("b")) is not None and (await store.get("c")) is not None
    refused = await store.open_turn("a", lambda: _fresh("a"), "new body", 9.0, free_retries=2,
                                    message_count=1, disclosure_index=None)
    assert refused.grant.kind is GrantKind.FINISHED  # eviction never reopens a budget
    assert not await store.create(_fresh("a"))
