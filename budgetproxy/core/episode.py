"""Episode state and turn accounting: reserve before forwarding, settle after, finish once."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any, Literal, NamedTuple

from budgetproxy.core import axes

Arm = Literal["hidden", "disclosed"]
Outcome = Literal["success", "failure"]
EndReason = Literal["success", "failure", "exhausted", "abandoned"]


@dataclass
class EpisodeState:
    """Everything a store keeps for one episode. Plain values, so any store can hold it."""

    episode_id: str
    budget: int
    max_turns: int | None
    disclosure: Arm
    task_id: str | None = None
    group: str | None = None
    announced_budget: int | None = None
    tags: dict[str, Any] = field(default_factory=dict)
    created_at: float = 0.0
    last_activity: float = 0.0
    model: str | None = None
    # Accounting. turns_used counts charged turns including those still in flight.
    turns_used: int = 0
    inflight: int = 0
    last_turn: int = 0
    last_attempt: int = 0
    last_hash: str | None = None
    last_state: Literal["none", "inflight", "charged", "refunded"] = "none"
    last_charged: bool = False
    free_retries_used: int = 0
    refused: bool = False
    # Where earlier turns' disclosure texts went: [message index, turn, message count,
    # conversation digest] (the last two: what that turn sent, see core.fingerprint), in
    # the order placed (`place`). A turn's snapshot (store TurnOpen.state) may leave them
    # out: its grant carries what the turn needs, and a store's `get` reads them all.
    disclosed_at: list[list[Any]] = field(default_factory=list)
    # Number of client messages seen by the previous turn (for logging only the new ones),
    # and the digest of those messages (the next turn logs all when its prefix differs).
    messages_seen: int = 0
    messages_digest: str | None = None
    # End of the episode.
    status: Literal["active", "finished"] = "active"
    outcome: Outcome | None = None
    success_turn: int | None = None
    reward: float | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    end_reason: EndReason | None = None
    ended_at: float | None = None
    # Ended with turns in flight: its end reason is settled, and it is recorded, once they are.
    end_pending: bool = False
    # Budgets on other axes (core.axes); None: no cap on that axis.
    token_budget: int | None = None
    cost_budget: float | None = None
    time_budget_s: float | None = None
    announced_tokens: int | None = None
    announced_cost: float | None = None
    announced_time_s: float | None = None
    tokens_used: int = 0
    cost_used: float = 0.0
    tokens_reserved: int = 0  # held by calls in flight (their output caps)
    cost_reserved: float = 0.0
    first_call_at: float | None = None
    exhausted_by: str | None = None  # the axis other than turns that ended it (or a refusal's)
    # Disclosed texts with axis fields, by turn (str): re-applied as they were (history: keep).
    told: dict[str, str] | None = None
    # The live experiment this episode is in and its arm there (core.experiment).
    experiment: str | None = None
    arm: str | None = None
    # The fewest turns the task can be solved in, as the harness stated it on the first call:
    # recorded for the analysis (the ceiling per budget), never enforced.
    min_turns: int | None = None

    @property
    def remaining(self) -> int:
        return max(0, self.budget - self.turns_used)

    @property
    def exhausted(self) -> bool:
        return self.refused or self.turns_used >= self.budget or self.exhausted_by is not None

    @property
    def spent_axis(self) -> str | None:
        """Which axis ended (or is ending) the episode: "turns", "tokens", "cost", "time"."""
        if self.exhausted_by is not None:
            return self.exhausted_by
        return "turns" if self.refused or self.turns_used >= self.budget else None

    @property
    def settled_success_turn(self) -> int | None:
        """The success turn as recorded: the reported one (or the turns used when it was
        reported), never past the turns used, since a turn refunded after the report (it was
        in flight) is not one the agent succeeded in. The report itself is kept as sent, so
        the same report again is still recognised."""
        if self.success_turn is None:
            return None
        return min(self.success_turn, self.turns_used)

    def snapshot(self) -> EpisodeState:
        """A shallow copy, several times cheaper than copy.copy on this dataclass."""
        new = object.__new__(EpisodeState)
        new.__dict__.update(self.__dict__)
        return new

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EpisodeState:
        return cls(**d)


# An earlier turn's disclosure placement: (message index, turn, message count, digest).
Placed = tuple[int, int, int, str]


class Known(NamedTuple):
    """What a caller already holds of an episode's placements (core.replays): how many there
    are when it is right (`size`), the digest the newest was made for, and its own answer
    for them. A store that finds the placements as told hands `known` back with the newest
    alone; otherwise it sends them all."""

    size: int
    digest: str
    answer: tuple[tuple[int, int], ...]


class Placements(NamedTuple):
    """The placements earlier turns left, as a turn found them: how many, the newest, and all
    of them (`every`), or, when they were as the caller's `known` told, that handed back
    instead (`every` None), so the work and the reply do not grow with the turns."""

    size: int
    newest: Placed | None
    every: tuple[Placed, ...] | None
    known: Known | None = None


NO_PLACEMENTS = Placements(0, None, ())


def as_placed(p: list[Any]) -> Placed:
    return (int(p[0]), int(p[1]), int(p[2]), str(p[3]))


def placements_of(entries: list[list[Any]], known: Known | None) -> Placements:
    """An episode's placements (`EpisodeState.disclosed_at`) for a turn's grant."""
    n = len(entries)
    if not n:
        return NO_PLACEMENTS
    newest = as_placed(entries[-1])
    if known is not None and known.size == n and known.digest == newest[3]:
        return Placements(n, newest, None, known)
    return Placements(n, newest, placed(entries))


def place(entries: list[list[Any]], entry: list[Any]) -> None:
    """Add a turn's placement [index, turn, message count, digest] to an episode's, in place.

    Placements made in a longer conversation than this one belong to a history the client
    has since cut short: tracking restarts without them. One at the same index is replaced.
    In work that does not grow with the list: each placement first drops those of longer
    conversations, so the list is in order of message count and those are the newest; and an
    index is a position in its conversation (at most its message count), so one at this
    index can only be among the newest that have at least that many messages.
    """
    index, count = entry[0], entry[2]
    while entries and entries[-1][2] > count:
        entries.pop()
    i = len(entries) - 1
    while i >= 0 and entries[i][2] >= index:
        if entries[i][0] == index:
            del entries[i]  # (at most one: each placement replaces its index's)
            break
        i -= 1
    entries.append(entry)


def placed(entries: list[list[Any]]) -> tuple[Placed, ...]:
    """Stored placements as tuples; entries of an older layout (no digest) are left out."""
    # Built from a list, not a generator: tuple(generator) allocates ten slots and resizes,
    # so each result of 11+ placements would be freed onto CPython's free list of its size
    # without having been taken from it, and those lists (2,000 tuples per size) would grow
    # by one per turn until full: megabytes that read as a leak in a 15-minute soak.
    return tuple([(int(p[0]), int(p[1]), int(p[2]), str(p[3])) for p in entries if len(p) == 4])


class GrantKind(StrEnum):
    FORWARD = "forward"
    EXHAUSTED = "exhausted"
    FINISHED = "finished"
    NEED_PRICE = "need_price"  # the episode has a cost budget: ask again with the model's price
    HELD = "held"  # what is left of a token or cost budget is held by calls in flight


@dataclass(slots=True)
class Grant:
    """The core's answer to "may this call go upstream?"."""

    kind: GrantKind
    turn: int = 0
    attempt: int = 1
    charged: bool = False
    body_hash: str = ""
    # Disclosure placements of earlier turns, before this one was added.
    disclosed_at: Placements = NO_PLACEMENTS
    # What the previous turn sent: its message count and their digest.
    messages_seen: int = 0
    messages_digest: str | None = None
    # The call's hold on the other axes (None: the episode has none).
    hold: axes.AxisGrant | None = None


class SettleResult(StrEnum):
    OK = "ok"  # upstream answered (any status that is charged: 2xx and 4xx)
    # connect error, timeout, 5xx or 429 before any byte reached the client
    REFUNDABLE = "refundable"
    BROKEN = "broken"  # failed after bytes reached the client: charged


def reserve(
    st: EpisodeState,
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
    output_hold: int = axes.OUTPUT_HOLD,
    placements_known: Known | None = None,
) -> Grant:
    """Decide whether a model call may be forwarded, and reserve its turn. Mutates `st`.

    `disclosure_index` is the client-message index this turn's disclosure text attaches to
    (None when nothing is disclosed). On the disclosed arm it is remembered, with
    `message_count` and `fingerprint` (the digest of the call's messages), so later turns can
    re-apply it where their conversation still extends this one. The first forwarded turn's
    `model` becomes the episode's model if it has none yet.

    An episode with budgets on other axes (core.axes) is refused once one is spent, and a
    forwarded call holds its output cap (`client_cap`, clamped) on them; `out_rate` is the
    model's USD per output token, needed when the episode has a cost budget.

    The grant carries the earlier placements (`placements_of`): only the newest when they are
    as `placements_known` tells (a caller that holds its answer for the others).
    """
    if st.status == "finished":
        return Grant(GrantKind.FINISHED, turn=st.last_turn)
    hold = None
    if axes.has_axes(st):
        planned = axes.plan(st, now, client_cap, out_rate, output_hold)
        if not isinstance(planned, axes.AxisGrant):  # why no hold: a word
            if planned == axes.NEED_PRICE:
                return Grant(GrantKind.NEED_PRICE)
            if planned == axes.HELD:
                return Grant(GrantKind.HELD, turn=st.turns_used)
            st.refused = True
            if st.exhausted_by is None:
                st.exhausted_by = planned
            return Grant(GrantKind.EXHAUSTED, turn=st.turns_used)
        hold = planned
    prior = placements_of(st.disclosed_at, placements_known)
    seen, digest = st.messages_seen, st.messages_digest
    is_retry = st.last_hash == body_hash and st.last_state in ("charged", "refunded")
    if is_retry and st.last_state == "charged" and st.free_retries_used < free_retries:
        st.free_retries_used += 1
        st.last_attempt += 1
        charged = False
        turn = st.last_turn
    elif is_retry and st.last_state == "refunded":
        if st.turns_used >= st.budget:
            return _no_turns_left(st)
        st.turns_used += 1
        st.last_attempt += 1
        charged = True
        turn = st.last_turn
    else:
        if st.turns_used >= st.budget:
            return _no_turns_left(st)
        st.turns_used += 1
        st.last_turn = st.turns_used
        st.last_attempt = 1
        st.free_retries_used = 0
        st.last_hash = body_hash
        charged = True
        turn = st.last_turn
    if hold is not None:
        axes.apply(st, hold, now)
    st.last_state = "inflight"
    st.last_charged = charged
    st.inflight += 1
    st.last_activity = now
    st.messages_seen = message_count
    st.messages_digest = fingerprint or None
    if st.model is None and model is not None:
        st.model = model
    if disclosure_index is not None and st.disclosure == "disclosed":  # hidden: none to redo
        place(st.disclosed_at, [disclosure_index, turn, message_count, fingerprint or ""])
    return Grant(
        GrantKind.FORWARD,
        turn=turn,
        attempt=st.last_attempt,
        charged=charged,
        body_hash=body_hash,
        disclosed_at=prior,
        messages_seen=seen,
        messages_digest=digest,
        hold=hold,
    )


def _no_turns_left(st: EpisodeState) -> Grant:
    st.refused = True
    return Grant(GrantKind.EXHAUSTED, turn=st.turns_used)


def settle(
    st: EpisodeState, grant: Grant, result: SettleResult, now: float, *, count_failed: bool,
    spend: axes.Spend | None = None, timed_out: bool = False,
) -> bool:
    """Close a forwarded turn. Returns True when its turn was refunded. Mutates `st`.

    An episode ended while this turn was in flight (`end_pending`) takes the refund too, and
    its end reason follows the settled numbers; the last such turn to settle clears
    `end_pending` (the episode is then recorded). An episode already recorded keeps the
    numbers it was recorded with.
    """
    st.inflight = max(0, st.inflight - 1)
    st.last_activity = now
    refund = result is SettleResult.REFUNDABLE and grant.charged and not count_failed
    if refund and (st.status == "active" or st.end_pending):
        st.turns_used = max(0, st.turns_used - 1)
    if grant.hold is not None and (st.status == "active" or st.end_pending):
        axes.settle(st, grant.hold, spend, result is SettleResult.REFUNDABLE,
                    timed_out=timed_out)
    if grant.turn == st.last_turn and grant.body_hash == st.last_hash:
        if refund:
            st.last_state = "refunded"
        elif grant.charged or st.last_state == "inflight":
            st.last_state = "charged"
    if st.end_pending:
        st.end_reason = end_reason(st)
        st.end_pending = st.inflight > 0
    return refund


def end_reason(st: EpisodeState) -> EndReason:
    """success (reported) > exhausted > failure (reported) > abandoned."""
    if st.outcome == "success":
        return "success"
    if st.exhausted:
        return "exhausted"
    if st.outcome == "failure":
        return "failure"
    return "abandoned"


@dataclass(frozen=True)
class OutcomeReport:
    success: bool
    reward: float | None = None
    success_turn: int | None = None
    metadata: dict[str, Any] = field(default_factory=dict)


class FinishStatus(StrEnum):
    FINISHED = "finished"  # this call ended the episode
    SAME = "same"  # already ended with the same report
    CONFLICT = "conflict"  # already ended differently


def finish(
    st: EpisodeState, report: OutcomeReport | None, now: float, *, await_turns: bool = True
) -> FinishStatus:
    """End an episode, with a harness report or without one (end, idle, shutdown).

    With turns still in flight the end reason is provisional: those turns may yet be
    refunded, so `end_pending` is set and `settle` completes the ending (`await_turns`
    False: the ending is final now, for a process stopping or a replica presumed dead).
    """
    if st.status == "finished":
        if report is None:
            return FinishStatus.SAME
        same = (
            st.outcome == ("success" if report.success else "failure")
            and st.reward == report.reward
            and st.success_turn == (report.success_turn or st.success_turn)
        )
        return FinishStatus.SAME if same else FinishStatus.CONFLICT
    if report is not None:
        st.outcome = "success" if report.success else "failure"
        st.reward = report.reward
        st.metadata = dict(report.metadata)
        if report.success:
            st.success_turn = (
                report.success_turn if report.success_turn is not None else st.turns_used
            )
    st.status = "finished"
    st.disclosed_at = []  # no turn of it is opened again: nothing to re-apply
    st.ended_at = now
    st.end_reason = end_reason(st)
    st.end_pending = await_turns and st.inflight > 0
    return FinishStatus.FINISHED
