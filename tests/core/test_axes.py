"""Budgets on tokens, cost and seconds in the pure core: no interleaving overspends past the
documented bound, clamping never raises a client's cap, the time and price rules."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from budgetproxy.core import axes
from budgetproxy.core.episode import (
    EpisodeState,
    Grant,
    GrantKind,
    SettleResult,
    end_reason,
    reserve,
    settle,
)
from budgetproxy.core.prices import PriceTable
from budgetproxy.core.usage import billed_tokens


def _state(**kw: object) -> EpisodeState:
    return EpisodeState(episode_id="e", budget=1000, max_turns=None, disclosure="hidden",
                        **kw)  # type: ignore[arg-type]


def _reserve(s: EpisodeState, h: str, now: float = 0.0, cap: int | None = None,
             rate: float | None = None, hold: int = axes.OUTPUT_HOLD) -> Grant:
    return reserve(s, h, now, free_retries=0, message_count=1, disclosure_index=None,
                   client_cap=cap, out_rate=rate, output_hold=hold)


# ("reserve", client cap or None, input tokens, fraction of the cap it outputs, refundable)
# or ("settle", which in-flight call).
_op = st.one_of(
    st.tuples(st.just("reserve"), st.none() | st.integers(1, 400), st.integers(0, 300),
              st.floats(0, 1), st.booleans()),
    st.tuples(st.just("settle"), st.integers(0, 20)),
)


@settings(max_examples=300, deadline=None)
@given(budget=st.integers(1, 3000), cost_budget=st.none() | st.floats(0.0001, 0.01),
       ops=st.lists(_op, max_size=60))
def test_no_interleaving_overspends(budget: int, cost_budget: float | None,
                                    ops: list[tuple[object, ...]]) -> None:
    """Output never passes the budget; total spend passes it by at most the input of the
    calls in flight when the last call was admitted (their prompts are unknown until then)."""
    rate = 2e-6
    s = _state(token_budget=budget, cost_budget=cost_budget)
    inflight: list[tuple[Grant, int, int, bool]] = []
    out_total = 0
    cost_out = 0.0
    bound_inputs = 0
    n = 0
    for op in ops:
        if op[0] == "reserve":
            _, cap, tin, frac, fail = op
            assert isinstance(tin, int) and isinstance(frac, float)
            n += 1
            g = _reserve(s, f"h{n}", cap=cap if isinstance(cap, int) else None, rate=rate,
                         hold=150)
            if g.kind is GrantKind.HELD:
                assert inflight  # only calls in flight hold anything
                continue
            if g.kind is not GrantKind.FORWARD:
                assert g.kind is GrantKind.EXHAUSTED and s.exhausted_by in ("tokens", "cost")
                continue
            assert g.hold is not None
            # no cap sent at all: the model writes at most the usual hold (the assumption)
            sent = g.hold.cap if g.hold.cap is not None else (cap or g.hold.tokens)
            assert isinstance(sent, int)
            if isinstance(cap, int):
                assert sent <= cap  # clamping never raises the client's own cap
            tout = int(sent * frac)
            inflight.append((g, tin, tout, bool(fail)))
            bound_inputs = sum(t for _, t, _, _ in inflight)
        elif inflight:
            assert isinstance(op[1], int)
            i = op[1] % len(inflight)
            g, tin, tout, fail = inflight.pop(i)
            result = SettleResult.REFUNDABLE if fail else SettleResult.OK
            spend = None if fail else axes.Spend(tin + tout, (tin + tout) * rate)
            settle(s, g, result, 0.0, count_failed=False, spend=spend)
            if not fail:
                out_total += tout
                cost_out += tout * rate
        assert s.tokens_reserved >= 0
    for g, tin, tout, _ in inflight:  # the rest settle
        settle(s, g, SettleResult.OK, 0.0, count_failed=False,
               spend=axes.Spend(tin + tout, (tin + tout) * rate))
        out_total += tout
        cost_out += tout * rate
    assert (s.tokens_reserved, round(s.cost_reserved, 12)) == (0, 0)
    assert out_total <= budget
    assert s.tokens_used <= budget + bound_inputs
    if cost_budget is not None:
        assert cost_out <= cost_budget + 1e-12


@settings(max_examples=300, deadline=None)
@given(budget=st.integers(1, 5000), used=st.integers(0, 5000), reserved=st.integers(0, 5000),
       cap=st.none() | st.integers(1, 10**6))
def test_clamp_never_raises_client_cap(budget: int, used: int, reserved: int,
                                       cap: int | None) -> None:
    s = _state(token_budget=budget, tokens_used=used, tokens_reserved=reserved)
    planned = axes.plan(s, 0.0, cap, None)
    left = budget - used - reserved
    if left < 1:
        assert planned == ("tokens" if used >= budget else axes.HELD)
        return
    assert isinstance(planned, axes.AxisGrant)
    sent = planned.cap if planned.cap is not None else cap
    assert sent is not None and sent <= left and planned.tokens == sent
    if cap is not None:
        assert sent <= cap
        assert (planned.cap is None) == (cap <= left)


def test_sequential_agent_overspends_by_at_most_its_last_prompt() -> None:
    s = _state(token_budget=1000)
    spent_inputs = []
    for turn in range(10):
        g = _reserve(s, f"h{turn}", cap=300)
        if g.kind is not GrantKind.FORWARD:
            break
        assert g.hold is not None
        sent = g.hold.cap or 300
        tin = 100 + 50 * turn
        spent_inputs.append(tin)
        settle(s, g, SettleResult.OK, 0.0, count_failed=False,
               spend=axes.Spend(tin + sent, None))
    assert s.exhausted_by == "tokens" and s.spent_axis == "tokens"
    assert s.tokens_used <= 1000 + spent_inputs[-1]
    assert end_reason(s) == "exhausted"


def test_no_usage_charges_the_reservation_and_a_refund_charges_nothing() -> None:
    s = _state(token_budget=1000)
    g = _reserve(s, "a", cap=200)
    assert s.tokens_reserved == 200
    settle(s, g, SettleResult.OK, 0.0, count_failed=False, spend=None)
    assert (s.tokens_used, s.tokens_reserved) == (200, 0)
    g = _reserve(s, "b", cap=200)
    settle(s, g, SettleResult.REFUNDABLE, 0.0, count_failed=False, spend=None)
    assert (s.tokens_used, s.tokens_reserved, s.turns_used) == (200, 0, 1)


def test_a_request_without_a_cap_gets_one_only_when_little_is_left() -> None:
    s = _state(token_budget=1000)
    g = _reserve(s, "a", hold=300)
    assert g.hold is not None and (g.hold.cap, g.hold.tokens) == (None, 300)
    g2 = _reserve(s, "b", hold=300)
    assert g2.hold is not None and (g2.hold.cap, g2.hold.tokens) == (None, 300)
    g3 = _reserve(s, "c", hold=300)  # 400 left, still more than the hold
    assert g3.hold is not None and g3.hold.cap is None
    g4 = _reserve(s, "d", hold=300)  # 100 left: a cap is added
    assert g4.hold is not None and (g4.hold.cap, g4.hold.tokens) == (100, 100)


def test_cost_budget_needs_a_price_then_clamps_to_what_it_buys() -> None:
    s = _state(cost_budget=0.001)
    assert _reserve(s, "a").kind is GrantKind.NEED_PRICE
    assert s.turns_used == 0  # nothing reserved
    g = _reserve(s, "a", cap=10_000, rate=1e-6)  # $0.001 buys 1000 output tokens
    assert g.hold is not None and g.hold.cap == 1000
    assert abs(g.hold.cost - 0.001) < 1e-12
    assert _reserve(s, "b", cap=5, rate=1e-6).kind is GrantKind.HELD  # all of it held
    settle(s, g, SettleResult.OK, 0.0, count_failed=False, spend=axes.Spend(1000, 0.001))
    assert _reserve(s, "b", cap=5, rate=1e-6).kind is GrantKind.EXHAUSTED  # all spent
    assert s.exhausted_by == "cost"


def test_time_budget_runs_from_the_first_call_and_between_calls() -> None:
    s = _state(time_budget_s=10.0)
    g = _reserve(s, "a", now=100.0)
    assert g.hold is not None and g.hold.deadline == 110.0 and g.hold.cap is None
    settle(s, g, SettleResult.OK, 101.0, count_failed=False, spend=axes.Spend(5))
    g = _reserve(s, "b", now=109.0)
    assert g.hold is not None and g.hold.deadline == 110.0
    settle(s, g, SettleResult.BROKEN, 110.0, count_failed=False, timed_out=True)
    assert s.exhausted_by == "time"
    assert _reserve(s, "c", now=110.5).kind is GrantKind.EXHAUSTED
    assert axes.cumulative(s, 111.0) == {"turns": 2, "tokens": 5, "cost": None,
                                         "seconds": 11.0}


def test_turn_only_episodes_hold_nothing() -> None:
    s = _state()
    g = _reserve(s, "a", cap=50)
    assert g.hold is None and not axes.has_axes(s)
    assert axes.cumulative(s, 5.0)["tokens"] is None


def test_billed_tokens_count_cached_input_on_every_api() -> None:
    assert billed_tokens({"prompt_tokens": 100, "completion_tokens": 5,
                          "prompt_tokens_details": {"cached_tokens": 60}}) == (100, 5, 60, 0)
    assert billed_tokens({"input_tokens": 10, "output_tokens": 5,
                          "cache_read_input_tokens": 80,
                          "cache_creation_input_tokens": 10}) == (100, 5, 80, 10)
    assert billed_tokens(None) is None


def test_prices_overrides_win_over_the_library() -> None:
    t = PriceTable({"local-*": {"input_per_mtok": 1.0, "output_per_mtok": 2.0}})
    assert t.rates("local-7b") == (1e-6, 2e-6)
    cost = t.cost("local-7b", {"prompt_tokens": 1000, "completion_tokens": 500})
    assert cost is not None and abs(cost - 0.002) < 1e-12
    assert t.rates("no-such-model-anywhere") is None
    lib = t.rates("gpt-4o-mini")
    assert lib is not None and lib[1] > lib[0] > 0
    assert t.cached_output_rate("gpt-4o-mini") == lib[1]


def test_budgetmix_draws_other_axes_per_group_on_their_grid() -> None:
    from budgetproxy.config import BudgetConfig, BudgetMixConfig, DisclosureConfig
    from budgetproxy.core.spec import EpisodeSpec, new_episode

    cfg = BudgetConfig(sampler="budgetmix", budgetmix=BudgetMixConfig(
        max_turns=10, step=0.25, max_tokens=8000, max_time_s=600))
    disc = DisclosureConfig()

    def ep(eid: str, group: str, **kw: object) -> EpisodeState:
        return new_episode(EpisodeSpec(eid, task_id="t", group=group, **kw),  # type: ignore[arg-type]
                           cfg, disc, 0.0)

    a, b = ep("a", "g1"), ep("b", "g1")
    assert (a.token_budget, a.time_budget_s) == (b.token_budget, b.time_budget_s)
    draws = {ep(f"e{i}", f"g{i}").token_budget for i in range(60)}
    assert draws <= {2000, 4000, 6000, 8000} and len(draws) > 1
    assert {ep(f"e{i}", f"g{i}").time_budget_s for i in range(60)} <= {150.0, 300.0, 450.0,
                                                                         600.0}
    assert a.cost_budget is None  # no full cost budget configured: no draw
    assert ep("c", "g1", token_budget=123).token_budget == 123  # explicit wins


def test_what_calls_in_flight_hold_is_not_spent() -> None:
    s = _state(token_budget=100)
    g = _reserve(s, "a", cap=100)  # holds all that is left
    held = _reserve(s, "b", cap=10)
    assert held.kind is GrantKind.HELD
    assert s.exhausted_by is None and not s.refused and s.turns_used == 1
    settle(s, g, SettleResult.OK, 0.0, count_failed=False, spend=axes.Spend(30))
    assert _reserve(s, "b", cap=10).kind is GrantKind.FORWARD  # held tokens came back
    c = _state(cost_budget=0.001)
    _reserve(c, "a", cap=1000, rate=1e-6)
    assert _reserve(c, "b", cap=10, rate=1e-6).kind is GrantKind.HELD and c.exhausted_by is None
