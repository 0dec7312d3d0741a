"""Turn accounting in the pure core: reserve/settle/refund never overspend; retries; end reasons."""

from __future__ import annotations

import sys
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from budgetproxy.core.episode import (
    NO_PLACEMENTS,
    EpisodeState,
    FinishStatus,
    Grant,
    GrantKind,
    Known,
    OutcomeReport,
    Placements,
    SettleResult,
    end_reason,
    finish,
    place,
    placed,
    placements_of,
    reserve,
    settle,
)


def fresh(budget: int = 3) -> EpisodeState:
    return EpisodeState(episode_id="e", budget=budget, max_turns=None, disclosure="hidden")


def res(s: EpisodeState, h: str = "h", free: int = 2) -> Grant:
    return reserve(s, h, 0.0, free_retries=free, message_count=1, disclosure_index=None)


# An operation: ("reserve", body hash) or ("settle", which in-flight grant, result).
ops = st.lists(
    st.one_of(
        st.tuples(st.just("reserve"), st.sampled_from(["a", "b", "c"])),
        st.tuples(
            st.just("settle"),
            st.integers(0, 10),
            st.sampled_from(list(SettleResult)),
        ),
    ),
    max_size=60,
)


@settings(max_examples=400, deadline=None)
@given(
    budget=st.integers(1, 6),
    free=st.integers(0, 3),
    count_failed=st.booleans(),
    operations=ops,
    settle_rest=st.booleans(),
)
def test_no_interleaving_overspends(
    budget: int, free: int, count_failed: bool, operations: list[tuple], settle_rest: bool
) -> None:
    s = fresh(budget)
    inflight: list[Grant] = []
    charged_forwards = 0  # charged grants forwarded and not refunded
    charged_grants = free_grants = 0
    for op in operations:
        if op[0] == "reserve":
            g = res(s, op[1], free)
            if g.kind is GrantKind.FORWARD:
                assert 1 <= g.turn <= budget
                assert g.attempt >= 1
                inflight.append(g)
                if g.charged:
                    charged_forwards += 1
                    charged_grants += 1
                else:
                    free_grants += 1
                # an agent resending one body cannot loop upstream for free
                assert free_grants <= free * charged_grants
            else:
                assert g.kind is GrantKind.EXHAUSTED
                assert s.turns_used >= budget
                assert s.exhausted
        elif inflight:
            g = inflight.pop(op[1] % len(inflight))
            refunded = settle(s, g, op[2], 0.0, count_failed=count_failed)
            if refunded:
                assert g.charged and op[2] is SettleResult.REFUNDABLE and not count_failed
                charged_forwards -= 1
            else:
                assert not (g.charged and op[2] is SettleResult.REFUNDABLE and not count_failed)
        assert 0 <= s.turns_used <= budget
        assert s.turns_used == charged_forwards
        assert s.inflight == len(inflight)
        assert s.remaining == budget - s.turns_used
    if settle_rest:
        for g in inflight:
            settle(s, g, SettleResult.OK, 0.0, count_failed=count_failed)
        assert s.inflight == 0
        assert s.turns_used == charged_forwards <= budget


@settings(max_examples=200, deadline=None)
@given(budget=st.integers(1, 8), parallel=st.integers(1, 30))
def test_parallel_reservations_forward_exactly_min_n_r(budget: int, parallel: int) -> None:
    s = fresh(budget)
    grants = [res(s, f"body-{i}") for i in range(parallel)]
    forwarded = [g for g in grants if g.kind is GrantKind.FORWARD]
    assert len(forwarded) == min(parallel, budget)
    assert sorted(g.turn for g in forwarded) == list(range(1, len(forwarded) + 1))


def test_identical_resend_after_charged_turn_is_free_up_to_the_limit() -> None:
    s = fresh(10)
    g1 = res(s, "x", free=2)
    settle(s, g1, SettleResult.OK, 0.0, count_failed=False)
    seen = [(g1.turn, g1.attempt, g1.charged)]
    for _ in range(3):
        g = res(s, "x", free=2)
        settle(s, g, SettleResult.OK, 0.0, count_failed=False)
        seen.append((g.turn, g.attempt, g.charged))
    assert seen == [(1, 1, True), (1, 2, False), (1, 3, False), (2, 1, True)]
    assert s.turns_used == 2


def test_identical_resend_while_the_turn_is_in_flight_is_a_new_turn() -> None:
    s = fresh(10)
    res(s, "x")
    g2 = res(s, "x")
    assert (g2.turn, g2.charged) == (2, True)


def test_identical_resend_after_refund_is_charged_as_that_turn() -> None:
    s = fresh(10)
    g1 = res(s, "x")
    assert settle(s, g1, SettleResult.REFUNDABLE, 0.0, count_failed=False)
    assert s.turns_used == 0
    g2 = res(s, "x")
    assert (g2.turn, g2.attempt, g2.charged) == (1, 2, True)
    assert s.turns_used == 1


def test_count_failed_turns_charges_failures() -> None:
    s = fresh(10)
    g = res(s, "x")
    assert not settle(s, g, SettleResult.REFUNDABLE, 0.0, count_failed=True)
    assert s.turns_used == 1


def test_broken_stream_is_charged() -> None:
    s = fresh(10)
    g = res(s, "x")
    assert not settle(s, g, SettleResult.BROKEN, 0.0, count_failed=False)
    assert s.turns_used == 1


def test_refused_call_marks_exhausted_and_finished_refuses() -> None:
    s = fresh(1)
    settle(s, res(s, "a"), SettleResult.OK, 0.0, count_failed=False)
    assert res(s, "b").kind is GrantKind.EXHAUSTED
    assert s.exhausted and s.refused
    finish(s, None, 1.0)
    assert res(s, "c").kind is GrantKind.FINISHED


@pytest.mark.parametrize(
    ("used", "budget", "refused", "report", "reason"),
    [
        (3, 3, False, OutcomeReport(success=True), "success"),
        (1, 3, True, OutcomeReport(success=True), "success"),
        (3, 3, False, OutcomeReport(success=False), "exhausted"),
        (1, 3, True, OutcomeReport(success=False), "exhausted"),
        (3, 3, False, None, "exhausted"),
        (1, 3, False, OutcomeReport(success=False), "failure"),
        (1, 3, False, None, "abandoned"),
        (0, 3, False, None, "abandoned"),
    ],
)
def test_end_reason_precedence(
    used: int, budget: int, refused: bool, report: OutcomeReport | None, reason: str
) -> None:
    s = fresh(budget)
    s.turns_used, s.refused = used, refused
    assert finish(s, report, 5.0) is FinishStatus.FINISHED
    assert s.end_reason == reason == end_reason(s)
    assert s.status == "finished" and s.ended_at == 5.0


def test_success_turn_defaults_to_turns_used() -> None:
    s = fresh(5)
    s.turns_used = 4
    finish(s, OutcomeReport(success=True, reward=1.0), 0.0)
    assert s.success_turn == 4 and s.reward == 1.0


def test_second_report_same_or_conflict() -> None:
    s = fresh(5)
    s.turns_used = 2
    assert finish(s, OutcomeReport(success=True, reward=0.5), 0.0) is FinishStatus.FINISHED
    assert finish(s, OutcomeReport(success=True, reward=0.5), 1.0) is FinishStatus.SAME
    assert finish(s, OutcomeReport(success=False, reward=0.5), 1.0) is FinishStatus.CONFLICT
    assert finish(s, OutcomeReport(success=True, reward=0.7), 1.0) is FinishStatus.CONFLICT
    assert finish(s, OutcomeReport(success=True, success_turn=1), 1.0) is FinishStatus.CONFLICT
    assert finish(s, None, 1.0) is FinishStatus.SAME
    assert s.outcome == "success" and s.ended_at == 0.0


def test_state_round_trips_through_a_dict() -> None:
    s = fresh(4)
    res(s, "a", free=1)
    assert EpisodeState.from_dict(s.to_dict()) == s


@settings(max_examples=300, deadline=None)
@given(
    budget=st.integers(1, 4),
    done=st.lists(st.sampled_from(list(SettleResult)), max_size=4),
    in_flight=st.lists(st.sampled_from(list(SettleResult)), min_size=1, max_size=3),
    report=st.none() | st.builds(OutcomeReport, success=st.booleans(),
                                 success_turn=st.none() | st.integers(1, 4)),
)
def test_an_ending_with_turns_in_flight_follows_the_settled_numbers(
    budget: int, done: list[SettleResult], in_flight: list[SettleResult],
    report: OutcomeReport | None,
) -> None:
    """Ending while turns are in flight gives the same end reason and numbers as ending
    right after they settled (the report, whatever its turn, says no more than they allow)."""
    def play(end_first: bool) -> EpisodeState:
        s = fresh(budget)
        for i, result in enumerate(done):
            g = res(s, f"d{i}")
            if g.kind is GrantKind.FORWARD:
                settle(s, g, result, 0.0, count_failed=False)
        held = [(res(s, f"f{i}"), r) for i, r in enumerate(in_flight)]
        if end_first:
            finish(s, report, 1.0)
            assert s.end_pending == any(g.kind is GrantKind.FORWARD for g, _ in held)
        for i, (g, result) in enumerate(held):
            if g.kind is GrantKind.FORWARD:
                settle(s, g, result, 2.0, count_failed=False)
                last = all(h.kind is not GrantKind.FORWARD for h, _ in held[i + 1:])
                assert s.end_pending == (end_first and not last)
        if not end_first:
            finish(s, report, 1.0)
        return s

    early, late = play(True), play(False)
    assert not early.end_pending
    assert (early.end_reason, early.turns_used, early.exhausted, early.outcome,
            early.settled_success_turn) == (late.end_reason, late.turns_used, late.exhausted,
                                            late.outcome, late.settled_success_turn)
    assert early.end_reason == end_reason(early)
    if early.settled_success_turn is not None:
        assert early.settled_success_turn <= early.turns_used


def test_an_episode_recorded_keeps_its_numbers() -> None:
    """An ending that did not wait (shutdown, a replica presumed dead) is final."""
    s = fresh(2)
    g = res(s, "a")
    finish(s, None, 1.0, await_turns=False)
    assert not s.end_pending and s.turns_used == 1
    assert settle(s, g, SettleResult.REFUNDABLE, 2.0, count_failed=False)
    assert (s.turns_used, s.end_reason) == (1, "abandoned")


def test_placements_are_kept_with_what_their_turn_sent() -> None:
    """Each disclosed turn's placement keeps its message count and conversation digest; one
    from a longer conversation than the current is dropped (it can never be extended)."""
    s = EpisodeState(episode_id="e", budget=9, max_turns=None, disclosure="disclosed")

    def turn(count: int, digest: str) -> Grant:
        g = reserve(s, f"h{count}{digest}", 0.0, free_retries=0, message_count=count,
                    disclosure_index=count - 1, fingerprint=digest)
        settle(s, g, SettleResult.OK, 0.0, count_failed=False)
        return g

    turn(2, "d2")
    g = turn(4, "d4")
    assert (g.messages_seen, g.messages_digest, g.disclosed_at.every) == (
        2, "d2", ((1, 1, 2, "d2"),))
    g = turn(3, "d3")  # shrank: turn 2's placement (4 messages) cannot come back
    assert g.disclosed_at.every == ((1, 1, 2, "d2"), (3, 2, 4, "d4"))
    assert s.disclosed_at == [[1, 1, 2, "d2"], [2, 3, 3, "d3"]]
    assert (s.messages_seen, s.messages_digest) == (3, "d3")
    hidden = fresh(5)
    reserve(hidden, "h", 0.0, free_retries=0, message_count=2, disclosure_index=1,
            fingerprint="d")
    assert hidden.disclosed_at == [] and hidden.messages_digest == "d"


def _placed_as_before(entries: list[list[Any]], entry: list[Any]) -> list[list[Any]]:
    """The rule `place` keeps, as it was written before: every placement at the same index
    and every one of a longer conversation dropped, then the new one appended."""
    return [*[p for p in entries if p[0] != entry[0] and p[2] <= entry[2]], entry]


@given(st.lists(st.tuples(st.integers(0, 12), st.integers(0, 12)), max_size=40))
def test_place_keeps_the_rule_in_work_at_the_end_of_the_list(
        turns: list[tuple[int, int]]) -> None:
    """Conversations that grow, shrink and are rewritten, with a placement anywhere in each
    (an index is a position in its conversation: at most its message count): placing at the
    end of the list keeps the same placements, in the same order, as filtering all of them."""
    entries: list[list[Any]] = []
    expected: list[list[Any]] = []
    for turn, (count, offset) in enumerate(turns, 1):
        entry = [max(0, count - offset), turn, count, f"{count}:{turn}"]
        place(entries, entry)
        expected = _placed_as_before(expected, entry)
        assert entries == expected


def test_a_turn_that_knows_the_placements_gets_the_newest_alone() -> None:
    """A caller that holds its answer for an episode's placements (core.replays) is handed
    back that answer and the newest placement, not a copy of them all; the episode's list is
    changed in place. Any other turn gets them all."""
    s = EpisodeState(episode_id="e", budget=99, max_turns=None, disclosure="disclosed")
    live = s.disclosed_at
    for n in range(1, 6):
        reserve(s, f"h{n}", 0.0, free_retries=0, message_count=2 * n,
                disclosure_index=2 * n - 1, fingerprint=f"d{n}")
    known = Known(5, "d5", ((1, 1), (3, 2)))
    g = reserve(s, "h6", 0.0, free_retries=0, message_count=12, disclosure_index=11,
                fingerprint="d6", placements_known=known)
    assert g.disclosed_at == Placements(5, (9, 5, 10, "d5"), None, known)
    assert s.disclosed_at is live and len(live) == 6
    for n, stale in enumerate((Known(5, "d6", ()), Known(6, "d5", ())), 7):  # not as told
        before = placed(live)
        g = reserve(s, f"h{n}", 0.0, free_retries=0, message_count=2 * n,
                    disclosure_index=2 * n - 1, fingerprint=f"d{n}", placements_known=stale)
        assert g.disclosed_at.every == before and g.disclosed_at.known is None
    assert placements_of([], Known(1, "d", ())) == NO_PLACEMENTS


def test_placements_read_each_turn_leave_no_growing_free_lists() -> None:
    """placed() runs on every turn of a disclosed episode. A tuple built from a generator
    is allocated at ten slots and resized, so each result of 11+ placements would land on
    CPython's free list of its size without having been taken from it: up to 2,000 tuples
    per size kept for good, megabytes over a long run. Built from a list, it is balanced."""
    entries = [[i, i + 1, 2 * i + 2, f"{i}:digest"] for i in range(15)]
    for _ in range(50):
        placed(entries)
    before = sys.getallocatedblocks()
    for _ in range(3000):
        placed(entries)
    assert sys.getallocatedblocks() - before < 200
