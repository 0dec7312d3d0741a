"""Finished episodes as the memory store retains them: every field a read needs survives the
packing, and a retained episode takes under 1 KiB."""

from __future__ import annotations

import gc
import tracemalloc
import uuid

from budgetproxy.core.episode import EpisodeState, OutcomeReport, SettleResult
from budgetproxy.core.retained import pack, unpack
from budgetproxy.store.memory import MemoryStore


def finished(eid: str, now: float) -> EpisodeState:
    return EpisodeState(
        episode_id=eid, budget=20, max_turns=40, disclosure="disclosed", task_id=f"task-{eid[:8]}",
        group="g-0", tags={"experiment": "e1", "arm": "b"}, created_at=now, last_activity=now,
        model="claude-sonnet-4-5", turns_used=17, last_turn=17, status="finished",
        outcome="success", success_turn=17, reward=1.0, end_reason="success", ended_at=now + 9.5,
        token_budget=200_000, tokens_used=123_456, first_call_at=now + 0.25)


def test_pack_keeps_what_reads_need_and_drops_what_only_live_turns_need() -> None:
    st = finished("ep-1", 1_800_000_000.0)
    st.disclosed_at = [[1, 1, 2, "9:ab"]]
    st.metadata = {"big": "x" * 1000}
    st.last_hash = "h"
    back = unpack(pack(st))
    assert (back.disclosed_at, back.metadata, back.last_hash, back.told) == ([], {}, None, None)
    st.disclosed_at, st.metadata, st.last_hash = [], {}, None
    assert back == st
    plain = EpisodeState(episode_id="x", budget=1, max_turns=None, disclosure="hidden")
    assert unpack(pack(plain)) == plain  # no tags: stored as None, read back as {}


async def test_a_retained_finished_episode_takes_under_1_kib() -> None:
    n = 4000
    ids = [str(uuid.uuid4()) for _ in range(n)]  # as long as Claude Code's session ids
    store = MemoryStore()
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i, eid in enumerate(ids):
            now = 1_800_000_000.0 + i
            st = finished(eid, now)
            st.status, st.outcome, st.end_reason, st.ended_at = "active", None, None, None
            opened = await store.open_turn(eid, lambda st=st: st, f"h{i}", now, free_retries=2,
                                           message_count=3, disclosure_index=2,
                                           fingerprint="300:" + "ab" * 16)
            await store.close_turn(eid, opened.grant, SettleResult.OK, now, count_failed=False)
            await store.finish(eid, OutcomeReport(True, reward=1.0), now + 9.5)
            del st, opened
        gc.collect()
        per_episode = (tracemalloc.get_traced_memory()[0] - before) / n
    finally:
        tracemalloc.stop()
    assert await store.active_count() == 0
    got = await store.get(ids[0])
    assert got is not None and got.outcome == "success" and got.tags["arm"] == "b"
    print(f"{per_episode:.0f} bytes per retained finished episode")
    assert per_episode <= 1024, per_episode
