"""What rollouts keep as episodes run: group members joined and waiters woken
(store/groups.py), and each turn as the model saw it (store/turn_log.py)."""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from typing import Any

import orjson

from budgetproxy.core.episode import EpisodeState
from budgetproxy.core.tenants import tenant_of
from budgetproxy.errors import invalid_request
from budgetproxy.store.base import StoreUnavailable
from budgetproxy.store.groups import GroupKey, GroupStore
from budgetproxy.store.turn_log import TurnLog
from budgetproxy.telemetry.metrics import Metrics
from budgetproxy.trajectories.recorder import Recorder, strip_text
from budgetproxy.trajectories.sink import TrajectorySink

log = logging.getLogger("budgetproxy")

GROUP_SIZE_MAX = 10_000


def tenant_group(tenant: str | None, task_id: str, group: str) -> GroupKey:
    """A group's key in its tenant's namespace (the default one keeps the plain task id; a
    NUL, which no header can carry, parts a tenant from the task)."""
    return (task_id if tenant is None else f"{tenant}\0{task_id}"), group


def group_key(st: EpisodeState) -> GroupKey | None:
    """An episode's group: (task_id, group) in its tenant's namespace, when it names both."""
    if st.task_id is None or st.group is None:
        return None
    return tenant_group(tenant_of(st.episode_id), st.task_id, st.group)


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


TURN_FIELDS = ("turn", "attempt", "response", "finish_reason", "usage")
TOKEN_FIELDS = ("prompt_token_ids", "completion_token_ids", "logprobs")


def turn_entry(record: dict[str, Any], sent: list[Any] | None) -> dict[str, Any]:
    """A turn as GET /v1/episodes/{id}/trajectory gives it: the messages the model got."""
    entry = {k: record.get(k) for k in TURN_FIELDS}
    entry["messages"] = sent
    entry["disclosure_text"] = (record.get("disclosure") or {}).get("text")
    for k in TOKEN_FIELDS:
        if k in record:
            entry[k] = record[k]
    return entry


def with_rollout_group(scope: MutableMapping[str, Any], rollout_id: str) -> dict[str, Any]:
    """The scope of a call under /rollout/{rid}/attempt/{aid}/v1: its episode's task and group
    are the rollout's, unless its headers name others (read on the episode's first call)."""
    headers = list(scope["headers"])
    names = {k for k, _ in headers}
    value = rollout_id.encode("latin-1")
    for name in (b"x-episode-task", b"x-episode-group"):
        if name not in names:
            headers.append((name, value))
    return {**scope, "headers": headers}


class RolloutRecorder(Recorder):
    """A Recorder that also keeps each episode's group (joined when it starts, its waiters
    woken when it ends: once per episode across replicas, as its record is written) and,
    with a turn log, every answered turn with the messages the upstream got."""

    def __init__(self, sink: TrajectorySink, metrics: Metrics | None, content_full: bool,
                 groups: GroupStore, turns: TurnLog | None) -> None:
        super().__init__(sink, metrics, content_full)
        self.groups = groups
        self.turns = turns
        if turns is not None:
            self.keeps_turns = True

    async def turn(self, record: dict[str, Any], sent: list[Any] | None = None) -> None:
        await super().turn(record, sent)
        if self.turns is None or record.get("type") != "turn" or record.get("status") != "ok":
            return  # (a probe call's record is no episode's turn)
        if sent is not None and not self.content_full:
            sent = strip_text(sent)
        entry = turn_entry(record, sent)

        def small() -> bytes:  # past the episode's byte bound: the turn without its messages
            return orjson.dumps({**turn_entry(record, None), "truncated": True})

        try:
            data = orjson.dumps(entry)
        except (TypeError, ValueError):  # nesting past orjson's depth: kept without messages
            data = small()
        try:
            await self.turns.append(str(record["episode_id"]), data, small)
        except StoreUnavailable:
            log.warning("store unavailable: turn %s of %s not kept for its trajectory",
                        record.get("turn"), record.get("episode_id"))

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
