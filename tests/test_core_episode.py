"""Turn accounting in the pure core: reserve/settle/refund never overspend; retries; end reasons."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from budgetproxy.core.episode import (
    EpisodeState,
    FinishStatus,
    Grant,
    GrantKind,
    OutcomeReport,
    SettleResult,
    end_reason,
    finish,
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
