"""Budgets beside turns: tokens, cost and seconds, reserved before a call and settled after.

The rules, shared by both stores (the Redis scripts in `store/axes.lua` follow them line by
line):

- tokens: input + output as the upstream reports them, cached input included (it is part of
  the prompt the model read: OpenAI's `prompt_tokens` already counts it, Anthropic's cache
  read and creation tokens are added to `input_tokens`).
- cost (USD): the call's price from the price table (`core.prices`) for the usage reported.
- seconds: wall clock since the episode's first forwarded call; time between calls counts.

Reserve (before forwarding): a call is refused when an axis is spent (tokens or cost used +
reserved at or past the budget, or the time up). Otherwise its output cap (the client's own,
if any) is clamped to the output tokens left on the token budget and to those the cost
budget still buys at the model's output rate, and that cap (and its cost) is reserved.
Settle: the reservation is released and the reported usage charged. With no usage reported
the whole reservation is charged (no input tokens are known); a refunded call charges
nothing.

Bound: output tokens (and output cost at the reserving rate) never exceed the budget, for any
interleaving. Input is known only once reported, so total spend can pass the budget by at
most the input of the calls in flight when the last call was admitted (one prompt, for an
agent that waits for each answer).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any, Literal, NamedTuple

Axis = Literal["turns", "tokens", "cost", "time"]
AXES: tuple[Axis, ...] = ("turns", "tokens", "cost", "time")
# Costs are floats; a remainder below this is nothing left (sums of prices drift in the 1e-17s).
COST_EPS = 1e-12


class AxisGrant(NamedTuple):
    """What a forwarded call holds on the axes: the output cap to send (None: leave the
    request's own), the tokens and cost reserved, and the deadline (epoch seconds). (A named
    tuple: made on every such call, at half a frozen dataclass's cost.)"""

    cap: int | None = None
    tokens: int = 0
    cost: float = 0.0
    deadline: float | None = None


class Spend(NamedTuple):
    """What a settled call cost, from its reported usage."""

    tokens: int
    cost: float | None = None  # None: the episode has no cost budget, nothing was priced


def _maker(cls: Any) -> Any:
    """A named tuple's maker from a plain tuple of all its fields, made in C: the class's own
    __new__ is Python, and costs twice as much (these are made on every call holding axes)."""
    return functools.partial(tuple.__new__, cls)


grant_of: Callable[[tuple[int | None, int, float, float | None]], AxisGrant] = _maker(AxisGrant)
spend_of: Callable[[tuple[int, float | None]], Spend] = _maker(Spend)


NEED_PRICE = "need_price"
# What is left is held by calls in flight (not spent): this call waits its turn (a 429).
HELD = "held"


def has_axes(st: Any) -> bool:
    return st.token_budget is not None or st.cost_budget is not None or (
        st.time_budget_s is not None)


# Output tokens held for a call that sets no cap while more than this is left: no cap is
# added then (APIs refuse caps past a model's own maximum), and the bound assumes the call
# writes at most this much (budget.output_hold_tokens).
OUTPUT_HOLD = 16384


def plan(st: Any, now: float, client_cap: int | None, out_rate: float | None,
         output_hold: int = OUTPUT_HOLD) -> AxisGrant | Axis | str:
    """The reservation for a call, or the axis that is spent, or NEED_PRICE (a cost budget
    and no output rate given). Pure: `apply` makes the reservation."""
    deadline = None
    if st.time_budget_s is not None:
        start = st.first_call_at
        deadline = (now if start is None else start) + st.time_budget_s
        if now >= deadline:
            return "time"
    token_budget, cost_budget = st.token_budget, st.cost_budget
    if token_budget is None and cost_budget is None:  # time alone: nothing to hold
        return grant_of((None, 0, 0.0, deadline))
    cap = client_cap
    if token_budget is not None:
        used = st.tokens_used
        left = token_budget - used - st.tokens_reserved
        if left < 1:
            return "tokens" if used >= token_budget else HELD
        if cap is None or left < cap:
            cap = left
    cost = 0.0
    if cost_budget is not None:
        if out_rate is None:
            return NEED_PRICE
        unheld = cost_budget - st.cost_used
        left_cost = unheld - st.cost_reserved
        # the output tokens what is left buys (None: a free model, any number)
        affordable = math.floor(left_cost / out_rate + 1e-9) if out_rate > 0 else None
        if left_cost <= COST_EPS or (affordable is not None and affordable < 1):
            spent = unheld <= COST_EPS or (out_rate > 0 and math.floor(
                unheld / out_rate + 1e-9) < 1)
            return "cost" if spent else HELD
        if affordable is not None:
            if cap is None or affordable < cap:
                cap = affordable
            cost = cap * out_rate
    if cap is None:  # a free model and no cap of the client's: nothing to hold
        return grant_of((None, 0, cost, deadline))
    if client_cap is None and cap > output_hold:
        # plenty left: no cap added, the usual most a call writes held
        return grant_of((None, output_hold, cost * output_hold / cap if cost else 0.0,
                         deadline))
    return grant_of((None if cap == client_cap else cap, cap, cost, deadline))


def apply(st: Any, grant: AxisGrant, now: float) -> None:
    """Hold `grant`'s reservation on the episode. Mutates `st`."""
    if st.first_call_at is None:
        st.first_call_at = now
    st.tokens_reserved += grant.tokens
    st.cost_reserved += grant.cost


def settle(st: Any, grant: AxisGrant, spend: Spend | None, refunded: bool, *,
           timed_out: bool = False) -> None:
    """Release the reservation and charge what the call spent. Mutates `st`."""
    tokens, cost = grant.tokens, grant.cost
    if tokens:
        reserved = st.tokens_reserved - tokens
        st.tokens_reserved = reserved if reserved > 0 else 0
    if cost:
        held = st.cost_reserved - cost
        st.cost_reserved = held if held > 0.0 else 0.0
    if not refunded:
        if spend is not None:
            tokens = spend.tokens
            cost = spend.cost if spend.cost is not None else 0.0
        st.tokens_used += tokens
        if cost:
            st.cost_used += cost
    if st.exhausted_by is None:
        if st.token_budget is not None and st.tokens_used >= st.token_budget:
            st.exhausted_by = "tokens"
        elif st.cost_budget is not None and st.cost_used >= st.cost_budget - COST_EPS:
            st.exhausted_by = "cost"
        elif timed_out:
            st.exhausted_by = "time"


def time_used(st: Any, now: float) -> float:
    return 0.0 if st.first_call_at is None else max(0.0, now - st.first_call_at)


def cumulative(st: Any, now: float) -> dict[str, Any]:
    """The spend on every axis so far, for a turn record (None: not tracked on this episode).

    Cost and seconds are kept to 9 and 6 decimal places as int(x * 10**n + 0.5) / 10**n: the
    nearest double to an integer over 10**n prints as that short decimal. That is a quarter
    of round()'s cost, which goes through decimal strings; the two differ only on a tie, in
    the last place kept."""
    if not has_axes(st):
        return {"turns": st.turns_used, "tokens": None, "cost": None, "seconds": None}
    start = st.first_call_at
    return {
        "turns": st.turns_used,
        "tokens": st.tokens_used,
        "cost": int(st.cost_used * 1e9 + 0.5) / 1e9 if st.cost_budget is not None else None,
        "seconds": 0.0 if start is None or now <= start else int(
            (now - start) * 1e6 + 0.5) / 1e6,
    }


def view(st: Any, now: float) -> dict[str, Any]:
    """The axis fields of GET /v1/episodes/{id} and the episode record."""
    return {
        "token_budget": st.token_budget,
        "tokens_used": st.tokens_used,
        "cost_budget": st.cost_budget,
        "cost_used": round(st.cost_used, 9),
        "time_budget_s": st.time_budget_s,
        "time_used_s": round(time_used(st, now if st.ended_at is None else st.ended_at), 6),
        "exhausted_by": st.spent_axis,
        "announced_tokens": st.announced_tokens,
        "announced_cost": st.announced_cost,
        "announced_time_s": st.announced_time_s,
    }


def remaining(st: Any, now: float) -> dict[str, float | int | None]:
    """What is left on each axis other than turns, never below 0 (None: no cap)."""
    return {
        "tokens": None if st.token_budget is None else max(
            0, st.token_budget - st.tokens_used - st.tokens_reserved),
        "cost": None if st.cost_budget is None else max(
            0.0, st.cost_budget - st.cost_used - st.cost_reserved),
        "seconds": None if st.time_budget_s is None else max(
            0.0, st.time_budget_s - time_used(st, now)),
    }
