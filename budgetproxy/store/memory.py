"""In-memory episode store for one process: each operation runs without awaiting, so atomically.

Memory stays bounded by the episode rate, not by uptime: a finished episode is packed into
one tuple of what reads and late calls need (core/retained.py, under 1 KiB) and kept in end
order for `retention_s`, and at most `max_retained` of them (oldest evicted first); after that
only a hash of its id is remembered, for `remember_s` and at most `MAX_REMEMBERED` ids
(`ForgottenIds`), so a call naming it is still refused. The sweep pops expired entries from the
front instead of scanning every episode it ever saw.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable

from budgetproxy.core.axes import OUTPUT_HOLD, Spend, cumulative
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
from budgetproxy.core.retained import KEPT, Retained, pack, unpack
from budgetproxy.store.base import FinishOutcome, TurnClose, TurnOpen

REMEMBER_S = 30 * 86400  # how long a forgotten episode's id still refuses calls (as Redis)
MAX_REMEMBERED = 500_000  # and at most this many of them (oldest forgotten first)


_ENDED_AT = KEPT.index("ended_at")


def _forgotten_state(episode_id: str) -> EpisodeState:
    return EpisodeState(episode_id=episode_id, budget=0, max_turns=None, disclosure="hidden",
                        status="finished")


class ForgottenIds:
    """Ids of forgotten episodes, as 64-bit hashes in one set per slice (of time, and of at most
    a thirtieth of `max_ids`); a slice is dropped whole once all its ids are older than
    `remember_s` (an id is remembered for `remember_s` and at most one slice more), or, oldest
    first, while more than `max_ids` are remembered.

    ~100 bytes an id where a str key in an ordered dict took ~175, and a hard cap: at the
    default 500,000 ids the memory store's remembered ids stay under ~50 MB whatever the
    episode rate (Redis keeps its own for `remember_s`). The hash is the process's own str
    hash (the store lives in one process); a new id is mistaken for a forgotten one with
    probability (ids remembered) / 2**64.
    """

    SLICES = 30

    def __init__(self, remember_s: float, max_ids: int = MAX_REMEMBERED) -> None:
        self.remember_s = remember_s
        self.slice_s = remember_s / self.SLICES
        self.max_ids = max_ids
        # A slice also ends at 1/SLICES of the cap, so the cap drops a thirtieth at a time.
        self._slice_ids = max(1, max_ids // self.SLICES)
        self._slices: deque[_Slice] = deque()
        self._count = 0

    @staticmethod
    def _key(episode_id: str) -> int:
        return hash(episode_id) & 0xFFFF_FFFF_FFFF_FFFF

    def add(self, episode_id: str, now: float) -> None:
        slices = self._slices
        if (not slices or now - slices[-1].start >= self.slice_s
                or len(slices[-1].ids) >= self._slice_ids):
            slices.append(_Slice(now))
        last = slices[-1]
        before = len(last.ids)
        last.ids.add(self._key(episode_id))
        self._count += len(last.ids) - before
        last.newest = now

    def __contains__(self, episode_id: object) -> bool:
        if not isinstance(episode_id, str):
            return False
        key = self._key(episode_id)
        return any(key in s.ids for s in reversed(self._slices))

    def __len__(self) -> int:
        return self._count

    def expire(self, now: float) -> None:
        slices = self._slices
        # A slice holds at most max_ids / SLICES ids, so dropping old ones always gets under.
        while slices and (now - slices[0].newest >= self.remember_s
                          or (self._count > self.max_ids and len(slices) > 1)):
            self._count -= len(slices.popleft().ids)


class _Slice:
    __slots__ = ("start", "newest", "ids")

    def __init__(self, start: float) -> None:
        self.start = start
        self.newest = start
        self.ids: set[int] = set()


class MemoryStore:
    """Active episodes in a dict; finished ones in end order; then only remembered ids.

    An episode ended with turns in flight stays with the active ones (uncompacted, for its
    record) until the last of them settles.
    """

    def __init__(self, remember_s: float = REMEMBER_S, max_retained: int | None = None) -> None:
        self._active: dict[str, EpisodeState] = {}
        self._finished: OrderedDict[str, Retained] = OrderedDict()
        self._forgotten = ForgottenIds(remember_s)
        self._finish_replies: dict[str, int] = {}  # final replies given, by active episode
        self.max_retained = max_retained
        self.evicted = 0  # finished episodes forgotten early for max_retained (a metric reads it)

    def _lookup(self, episode_id: str) -> EpisodeState | None:
        st = self._active.get(episode_id)
        if st is not None:
            return st
        packed = self._finished.get(episode_id)
        return unpack(packed) if packed is not None else None

    def _ended(self, st: EpisodeState) -> None:
        eid = st.episode_id
        del self._active[eid]
        self._finish_replies.pop(eid, None)
        finished = self._finished
        finished[eid] = pack(st)
        cap = self.max_retained
        if cap is not None:
            while len(finished) > cap:  # the oldest first; its id keeps refusing calls
                old, _ = finished.popitem(last=False)
                self._forgotten.add(old, st.ended_at or 0.0)
                self.evicted += 1

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
        fingerprint: str | None = None,
        client_cap: int | None = None,
        out_rate: float | None = None,
        output_hold: int = OUTPUT_HOLD,
        placements_known: Known | None = None,
    ) -> TurnOpen:
        st = self._lookup(episode_id)
        created = False
        if st is None:
            if episode_id in self._forgotten:
                return TurnOpen(Grant(GrantKind.FINISHED), _forgotten_state(episode_id), False)
            st = fresh()
            self._active[episode_id] = st
            created = True
        grant = reserve(
            st,
            body_hash,
            now,
            free_retries=free_retries,
            message_count=message_count,
            disclosure_index=disclosure_index,
            model=model,
            fingerprint=fingerprint,
            client_cap=client_cap,
            out_rate=out_rate,
            output_hold=output_hold,
            placements_known=placements_known,
        )
        snap = st.snapshot()
        snap.disclosed_at = []  # (the live list, changed in place by later turns)
        return TurnOpen(grant, snap, created)

    async def close_turn(
        self, episode_id: str, grant: Grant, result: SettleResult, now: float, *,
        count_failed: bool, spend: Spend | None = None, timed_out: bool = False,
    ) -> TurnClose:
        st = self._lookup(episode_id)
        if st is None:
            return TurnClose(False, None)
        if episode_id in self._finished:  # a turn in flight when the process stopped
            refunded = settle(st, grant, result, now, count_failed=count_failed, spend=spend,
                              timed_out=timed_out)
            self._finished[episode_id] = pack(st)
            return TurnClose(refunded, None, False, None)
        pending = st.end_pending
        refunded = settle(st, grant, result, now, count_failed=count_failed, spend=spend,
                          timed_out=timed_out)
        ended = pending and not st.end_pending
        spent = cumulative(st, now) if grant.hold is not None else None
        if ended:
            self._ended(st)
            return TurnClose(refunded, st.snapshot(), True, spent)
        return TurnClose(refunded, None, False, spent)

    async def keep_told(self, episode_id: str, turn: int, text: str) -> None:
        st = self._active.get(episode_id)
        if st is not None and st.status == "active":
            st.told = {**(st.told or {}), str(turn): text}  # snapshots keep the dict they had

    async def finish_reply(self, episode_id: str, limit: int) -> bool:
        given = self._finish_replies.get(episode_id, 0)
        if episode_id not in self._active or given >= limit:
            return False
        self._finish_replies[episode_id] = given + 1
        return True

    async def create(self, fresh: EpisodeState) -> bool:
        eid = fresh.episode_id
        if self._lookup(eid) is not None or eid in self._forgotten:
            return False
        self._active[eid] = fresh
        return True

    async def get(self, episode_id: str) -> EpisodeState | None:
        st = self._lookup(episode_id)
        if st is None:
            return None
        snap = st.snapshot()
        snap.disclosed_at = list(st.disclosed_at)  # later turns change the live list in place
        return snap

    async def is_known(self, episode_id: str) -> bool:
        return self._lookup(episode_id) is not None or episode_id in self._forgotten

    async def finish(
        self, episode_id: str, report: OutcomeReport | None, now: float
    ) -> FinishOutcome:
        st = self._lookup(episode_id)
        if st is None:
            return FinishOutcome(None, None)
        status = finish(st, report, now)
        snap = st.snapshot()
        if status is FinishStatus.FINISHED and not st.end_pending:
            self._ended(st)
        return FinishOutcome(status, snap)

    async def expire_idle(
        self, now: float, idle_timeout_s: float, retention_s: float
    ) -> list[EpisodeState]:
        ended: list[EpisodeState] = []
        for st in [s for s in self._active.values() if s.inflight == 0]:
            if now - st.last_activity >= idle_timeout_s:
                finish(st, None, now)
                ended.append(st.snapshot())
                self._ended(st)
        finished, forgotten = self._finished, self._forgotten
        ended_at = _ENDED_AT
        while finished:
            eid, packed = next(iter(finished.items()))
            at = packed[ended_at]
            if at is not None and now - at < retention_s:
                break
            finished.popitem(last=False)
            forgotten.add(eid, now)
        forgotten.expire(now)
        return ended

    async def finish_all_active(self, now: float) -> list[EpisodeState]:
        ended = []
        for st in list(self._active.values()):
            if st.status == "finished":  # ended, waiting for turns in flight: no more waiting
                st.end_pending = False
            else:
                finish(st, None, now, await_turns=False)
            ended.append(st.snapshot())
            self._ended(st)
        return ended

    async def active_count(self) -> int:
        return len(self._active)

    async def ping(self) -> bool:
        return True

    async def close(self) -> None:
        return None
