"""The episode store interface: every state change is one atomic step on one episode."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from budgetproxy.core.axes import OUTPUT_HOLD, Spend
from budgetproxy.core.episode import (
    EpisodeState,
    FinishStatus,
    Grant,
    Known,
    OutcomeReport,
    SettleResult,
)


class StoreUnavailable(Exception):
    """The store could not be reached; the caller applies `store.on_unavailable`."""


class StoreBusy(StoreUnavailable):
    """Every connection of this process to the store stayed busy for the whole wait: the
    store itself may be healthy, so `fail_open` does not forward uncounted on it."""


# (Named tuples: one of each is made on every model call, at a third of a frozen
# dataclass's cost.)
class TurnOpen(NamedTuple):
    grant: Grant
    state: EpisodeState  # a snapshot after the reservation (placements left out)
    created: bool  # this call created the episode


class TurnClose(NamedTuple):
    refunded: bool
    # A snapshot after settling, for a call that ended its episode (`ended`); a store may
    # leave it None otherwise (as for an unknown episode).
    state: EpisodeState | None
    # This settle was the last in-flight turn of an episode ended meanwhile (`end_pending`):
    # the caller records the episode now. True for exactly one caller across replicas.
    ended: bool = False
    # For a call holding other axes (core.axes): the episode's spend on every axis after
    # settling (core.axes.cumulative), for the turn's record.
    spent: dict[str, Any] | None = None


@dataclass(frozen=True)
class FinishOutcome:
    status: FinishStatus | None  # None: unknown episode
    # With `state.end_pending` (turns still in flight) the episode is recorded by the
    # settle of its last turn (`TurnClose.ended`), not by the caller that ended it.
    state: EpisodeState | None


class EpisodeStore(Protocol):
    """Reserve/settle/finish each run as one atomic step (a lock, or one Lua script)."""

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
        """Create the episode with `fresh()` if it does not exist, then `core.episode.reserve`
        (`client_cap` and `out_rate` for its other axes, core.axes).

        `fresh` is called only for a new episode (its headers are read on the first call only);
        it may raise, and then nothing is stored.

        The grant carries the earlier disclosure placements: only the newest when they are as
        `placements_known` tells (core.episode.placements_of), so a warm caller's work does not
        grow with the turns. The state returned may leave the placements out (`get` has them).
        """
        ...

    def close_turn(
        self, episode_id: str, grant: Grant, result: SettleResult, now: float, *,
        count_failed: bool, spend: Spend | None = None, timed_out: bool = False,
    ) -> Awaitable[TurnClose]:
        """`core.episode.settle` (`spend`: the call's reported usage, for core.axes), done
        by the time the result is awaited. The Redis store sends it when called, so a caller
        may await it later (after logging the turn) without delaying it."""
        ...

    async def keep_told(self, episode_id: str, turn: int, text: str) -> None:
        """Remember the disclosure text `turn` was given (`EpisodeState.told`); nothing for
        an unknown or finished episode."""
        ...

    async def finish_reply(self, episode_id: str, limit: int) -> bool:
        """Count one final reply of an exhausted episode (finish mode): True while the active
        episode had given fewer than `limit`, False (nothing counted) once it has them all
        or is not active."""
        ...

    async def create(self, fresh: EpisodeState) -> bool:
        """Insert a new episode; False when the id exists (active, finished or remembered)."""
        ...

    async def get(self, episode_id: str) -> EpisodeState | None: ...

    async def is_known(self, episode_id: str) -> bool:
        """True for live episodes and for finished ones past retention (id remembered)."""
        ...

    async def finish(
        self, episode_id: str, report: OutcomeReport | None, now: float
    ) -> FinishOutcome:
        """`core.episode.finish`; `status` FINISHED exactly once per episode across replicas."""
        ...

    async def expire_idle(self, now: float, idle_timeout_s: float, retention_s: float) -> list[
        EpisodeState
    ]:
        """End idle active episodes (returns those this call ended); forget old finished ones."""
        ...

    async def finish_all_active(self, now: float) -> list[EpisodeState]:
        """End every active episode this process is responsible for (shutdown)."""
        ...

    async def active_count(self) -> int: ...

    async def ping(self) -> bool: ...

    async def close(self) -> None: ...
