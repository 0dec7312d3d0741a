"""Groups kept as episodes start and end: members joined, waiters woken (store/groups.py)."""

from __future__ import annotations

import logging

from budgetproxy.core.episode import EpisodeState
from budgetproxy.errors import invalid_request
from budgetproxy.store.base import StoreUnavailable
from budgetproxy.store.groups import GroupKey, GroupStore
from budgetproxy.telemetry.metrics import Metrics
from budgetproxy.trajectories.recorder import Recorder
from budgetproxy.trajectories.sink import TrajectorySink

log = logging.getLogger("budgetproxy")

GROUP_SIZE_MAX = 10_000


def group_key(st: EpisodeState) -> GroupKey | None:
    """An episode's group: (task_id, group), when it names both."""
    if st.task_id is None or st.group is None:
        return None
    return st.task_id, st.group


def group_size(headers: dict[bytes, bytes]) -> int | None:
    """X-Episode-Group-Size, read on an episode's first call."""
    raw = headers.get(b"x-episode-group-size")
    if raw is None or raw == b"":
        return None
    digits = raw.strip()
    if not digits.isdigit() or not 1 <= int(digits) <= GROUP_SIZE_MAX:
        raise invalid_request(
            f"Header X-Episode-Group-Size must be an integer from 1 to {GROUP_SIZE_MAX}, "
            f"got {raw.decode('latin-1')!r}", "group_size")
    return int(digits)


class GroupRecorder(Recorder):
    """A Recorder that also keeps each episode's group: joined when it starts, its waiters
    woken when it ends (once per episode across replicas, as its record is written)."""

    def __init__(self, sink: TrajectorySink, metrics: Metrics | None, content_full: bool,
                 groups: GroupStore) -> None:
        super().__init__(sink, metrics, content_full)
        self.groups = groups

    async def episode_started(self, st: EpisodeState) -> None:
        await super().episode_started(st)
        key = group_key(st)
        if key is not None:
            try:
                await self.groups.join(key, st.episode_id)
            except StoreUnavailable:
                log.warning("store unavailable: episode %s not added to its group",
                            st.episode_id)

    async def episode_ended(self, st: EpisodeState) -> None:
        await super().episode_ended(st)
        key = group_key(st)
        if key is not None:
            try:
                await self.groups.ended(key)
            except StoreUnavailable:
                log.warning("store unavailable: the end of %s woke no group waiter",
                            st.episode_id)
