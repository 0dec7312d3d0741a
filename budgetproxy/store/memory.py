"""In-memory episode store for one process: each operation runs without awaiting, so atomically."""

from __future__ import annotations

from collections.abc import Callable

from budgetproxy.core.episode import (
    EpisodeState,
    FinishStatus,
    Grant,
    GrantKind,
    OutcomeReport,
    SettleResult,
    finish,
    reserve,
    settle,
)
from budgetproxy.store.base import FinishOutcome, TurnOpen


def reserve_finished() -> Grant:
    return Grant(GrantKind.FINISHED)


def _forgotten_state(episode_id: str) -> EpisodeState:
    return EpisodeState(episode_id=episode_id, budget=0, max_turns=None, disclosure="hidden",
                        status="finished")


class MemoryStore:
    """Episodes in a dict. Finished episodes past retention leave only their id behind."""

    def __init__(self) -> None:
        self._episodes: dict[str, EpisodeState] = {}
        self._forgotten: set[str] = set()
        self._active = 0

    async def open_turn(
        self,
        episode_id: str,
        fresh: Callable[[], EpisodeState],
        body_hash: str,
        now: float,
        *,
        free_retries: int,
        message_count: int,
        disclosure_index: int | None,
        model: str | None = None,
    ) -> TurnOpen:
        eid = episode_id
        st = self._episodes.get(eid)
        created = False
        if st is None:
            if eid in self._forgotten:
                return TurnOpen(reserve_finished(), _forgotten_state(eid), False)
            else:
                st = fresh()
                self._episodes[eid] = st
                self._active += 1
                created = True
        grant = reserve(
            st,
            body_hash,
            now,
            free_retries=free_retries,
            message_count=message_count,
            disclosure_index=disclosure_index,
            model=model,
        )
        return TurnOpen(grant, st.snapshot(), created)

    async def close_turn(
        self, episode_id: str, grant: Grant, result: SettleResult, now: float, *, count_failed: bool
    ) -> tuple[bool, EpisodeState | None]:
        st = self._episodes.get(episode_id)
        if st is None:
            return False, None
        refunded = settle(st, grant, result, now, count_failed=count_failed)
        return refunded, st.snapshot()

    async def create(self, fresh: EpisodeState) -> bool:
        eid = fresh.episode_id
        if eid in self._episodes or eid in self._forgotten:
            return False
        self._episodes[eid] = fresh
        self._active += 1
        return True

    async def get(self, episode_id: str) -> EpisodeState | None:
        st = self._episodes.get(episode_id)
        return st.snapshot() if st is not None else None

    async def is_known(self, episode_id: str) -> bool:
        return episode_id in self._episodes or episode_id in self._forgotten

    async def finish(
        self, episode_id: str, report: OutcomeReport | None, now: float
    ) -> FinishOutcome:
        st = self._episodes.get(episode_id)
        if st is None:
            return FinishOutcome(None, None)
        status = finish(st, report, now)
        if status is FinishStatus.FINISHED:
            self._active -= 1
        return FinishOutcome(status, st.snapshot())

    async def expire_idle(
        self, now: float, idle_timeout_s: float, retention_s: float
    ) -> list[EpisodeState]:
        ended: list[EpisodeState] = []
        for eid, st in list(self._episodes.items()):
            if st.status == "active":
                if st.inflight == 0 and now - st.last_activity >= idle_timeout_s:
                    finish(st, None, now)
                    self._active -= 1
                    ended.append(st.snapshot())
            elif st.ended_at is not None and now - st.ended_at >= retention_s:
                del self._episodes[eid]
                self._forgotten.add(eid)
        return ended

    async def finish_all_active(self, now: float) -> list[EpisodeState]:
        ended = []
        for st in self._episodes.values():
            if st.status == "active":
                finish(st, None, now)
                ended.append(st.snapshot())
        self._active = 0
        return ended

    async def active_count(self) -> int:
        return self._active

    async def ping(self) -> bool:
        return True

    async def close(self) -> None:
        return None
