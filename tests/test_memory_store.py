"""The memory store stays bounded by the episode rate: compacted, then forgotten, then gone."""

from __future__ import annotations

from budgetproxy.core.episode import EpisodeState, GrantKind, OutcomeReport, SettleResult
from budgetproxy.store.memory import MemoryStore


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
