"""A model call's budgets beside turns: its output cap clamped, its deadline kept, its spend
settled from the reported usage, and what is left told in headers and the disclosure text."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple, TypeVar

import orjson

from budgetproxy.core import axes
from budgetproxy.core.episode import EpisodeState, SettleResult
from budgetproxy.core.prices import PriceTable
from budgetproxy.core.tenants import local_id
from budgetproxy.core.usage import token_counts
from budgetproxy.errors import ProxyError, invalid_request
from budgetproxy.proxy import capture, output_cap
from budgetproxy.proxy.asgi import Message, Send
from budgetproxy.proxy.calls import ModelCall
from budgetproxy.proxy.dialects import Reply
from budgetproxy.store.base import EpisodeStore, StoreUnavailable, TurnOpen

log = logging.getLogger("budgetproxy")
T = TypeVar("T")

_CODES = {"tokens": "token_budget_exhausted", "cost": "cost_budget_exhausted",
          "time": "time_budget_exhausted"}
_WHAT = {"tokens": "token budget", "cost": "cost budget", "time": "time budget"}


def client_cap(call: ModelCall, output_hold: int) -> int | None:
    """The most output tokens the call asks for (None: it sets no cap): its output cap, or,
    when it asks for several completions, that cap (or `output_hold`, the most a call with
    none is taken to write) for each of them, which a token or cost budget then holds."""
    payload = call.payload
    if not payload:
        return None
    cap = output_cap.client_cap(call.kind, payload)
    k = output_cap.completions(call.kind, payload)
    return cap if k == 1 else (output_hold if cap is None else cap) * k


def sent_cap(call: ModelCall, hold: axes.AxisGrant) -> int | None:
    """The output cap the call is sent with (None: the client's stands, or none, as its hold
    allows). A call asking for several completions shares a clamped hold among them: each is
    capped at its share (0: less than a token each)."""
    if hold.cap is None:
        return None
    payload = call.payload
    k = output_cap.completions(call.kind, payload) if payload else 1
    return hold.cap if k == 1 else hold.cap // k


def too_few_tokens(st: EpisodeState, call: ModelCall) -> ProxyError:
    """A call asking for more completions than what is left of its episode's token or cost
    budget gives a token each: the request's to change (400, param `n`)."""
    k = output_cap.completions(call.kind, call.payload or {})
    return invalid_request(
        f"This call asks for {k} completions (n, best_of and prompts), and what is left of "
        f"episode {local_id(st.episode_id)!r}'s token or cost budget allows less than one "
        "output token each; ask for fewer", "n")


def clamped(call: ModelCall, payload: dict[str, Any], cap: int) -> dict[str, Any]:
    call.payload = output_cap.with_cap(call.kind, payload, cap)
    return call.payload


async def output_rate(prices: PriceTable, model: str) -> float:
    """USD per output token for an episode with a cost budget; the first lookup of a model
    may load the price library, off the event loop."""
    rates = await asyncio.to_thread(prices.rates, model)
    if rates is None:
        raise invalid_request(
            f"No price is known for model {model!r}, and this episode has a cost budget: "
            "add the model under `prices` in the proxy's config", "model")
    return rates[1]


async def keep_told(store: EpisodeStore, episode_id: str, turn: int, text: str) -> None:
    """Keep the text this turn was told, for later turns to re-apply as it was (history:
    keep with axis fields, whose values change every turn); a store that fails here costs
    only that (later turns render it afresh)."""
    try:
        await store.keep_told(episode_id, turn, text)
    except StoreUnavailable:
        log.warning("store unavailable while keeping the disclosure text of %s", episode_id)


def reopened(opened: TurnOpen, created: bool) -> TurnOpen:
    return opened._replace(created=created or opened.created)


def axis_exhausted(st: EpisodeState, status: int = 403) -> ProxyError:
    axis = st.exhausted_by or "turns"
    return ProxyError(
        status, _CODES.get(axis, "turn_budget_exhausted"),
        f"Episode {local_id(st.episode_id)!r} has used its {_WHAT.get(axis, 'budget')}; "
        "no further model calls are forwarded. Report the outcome or start a new episode.",
        type_="budget_exhausted")


def held(st: EpisodeState) -> ProxyError:
    """A call that finds what is left of a budget held by calls in flight: a 429 with
    Retry-After (the episode untouched); like every 4xx here it says x-should-retry: false,
    so a harness retries it, not the SDK on its own."""
    return ProxyError(
        429, "budget_held",
        f"What is left of episode {local_id(st.episode_id)!r}'s token or cost budget is held "
        "by its calls in flight; retry once they finish.",
        type_="rate_limit_error", headers={"retry-after": "1"})


def read_reply(call: ModelCall) -> Reply:
    """The reply read back from what the upstream sent (an odd one: an empty reply). A
    captured answer's body is parsed once, for the reply and its tokens (`call.tokens`), here
    or as it was stripped (`call.answer`)."""
    reply: Reply = {"message": None, "finish_reason": None, "usage": None}
    try:
        if call.events is not None:
            reply = call.dialect.read_events(call.events)
        elif call.answer is not None:
            reply = call.dialect.read_parsed(call.answer)
        elif call.data and call.capture is not None and call.tokens is None:
            try:
                obj = orjson.loads(call.data)
            except orjson.JSONDecodeError:
                reply = call.dialect.read_body(call.data)  # (what it makes of a bad body)
            else:
                call.tokens = capture.read_parsed(obj)
                reply = call.dialect.read_parsed(obj)
        elif call.data:
            reply = call.dialect.read_body(call.data)
    except Exception:  # an odd reply costs its details in the log, never its record
        log.warning("could not read back the reply to %s (%s); its turn is logged without "
                    "it", call.route, call.episode_id, exc_info=True)
    return reply


def spend(prices: PriceTable, call: ModelCall, reply: Reply | None) -> axes.Spend | None:
    """What the call spent by its reported usage; None when it reported none."""
    usage = reply.get("usage") if reply else None
    counts = call.counts = token_counts(usage)  # (kept for the token metrics)
    tin, tout = counts
    if tin is None and tout is None:
        return None
    st = call.state
    cost = prices.cost(call.model or "", usage, counts) if st is not None and (
        st.cost_budget is not None) else None
    return axes.spend_of(((tin or 0) + (tout or 0), cost))


def as_settled(prices: PriceTable, call: ModelCall, st: EpisodeState) -> EpisodeState:
    """The episode as settling this forwarded call will leave it (core.axes.settle: its hold
    released, the spend its reported usage gives charged): what the headers of an answer read
    whole before its head is sent report as left. The body parsed here is kept on the call
    (`answer`), so reading the reply back for the settle parses it no second time."""
    grant = call.grant
    assert grant is not None and grant.hold is not None
    if call.answer is None and call.data:
        with contextlib.suppress(orjson.JSONDecodeError):
            obj = orjson.loads(call.data)
            if call.capture is not None and call.tokens is None:  # (as read_reply reads it)
                call.tokens = capture.read_parsed(obj)
            call.answer = obj
    out = st.snapshot()
    axes.settle(out, grant.hold, spend(prices, call, read_reply(call)),
                call.outcome.result is SettleResult.REFUNDABLE)
    return out


def add_remaining_headers(out: list[tuple[bytes, bytes]], st: EpisodeState) -> None:
    """Add X-Episode-{Tokens,Cost,Time}-Remaining of the axes the episode has to `out` (what
    is left after the reservations of calls in flight: this one's hold, or this one's spend
    when `st` is `as_settled`)."""
    if st.token_budget is not None:
        left = st.token_budget - st.tokens_used - st.tokens_reserved
        out.append((b"x-episode-tokens-remaining", b"%d" % (left if left > 0 else 0)))
    if st.cost_budget is not None:
        cost = st.cost_budget - st.cost_used - st.cost_reserved
        out.append((b"x-episode-cost-remaining", b"%.6f" % (cost if cost > 0.0 else 0.0)))
    if st.time_budget_s is not None:
        seconds = st.time_budget_s - axes.time_used(st, time.time())
        out.append((b"x-episode-time-remaining", b"%.3f" % (seconds if seconds > 0.0 else 0.0)))


def template_fields(st: EpisodeState, now: float) -> dict[str, Any]:
    """The disclosure template's axis fields as this turn starts; totals are the announced
    ones where set (used stays the real spend). Axes the episode lacks render as "n/a"."""
    used = {"tokens": st.tokens_used, "cost": round(st.cost_used, 6),
            "seconds": int(axes.time_used(st, now))}
    totals = {
        "tokens": st.announced_tokens if st.announced_tokens is not None else st.token_budget,
        "cost": st.announced_cost if st.announced_cost is not None else st.cost_budget,
        "seconds": st.announced_time_s if st.announced_time_s is not None else (
            st.time_budget_s),
    }
    out: dict[str, Any] = {}
    for axis, total in totals.items():
        if total is None:
            out.update({f"{axis}_total": "n/a", f"{axis}_remaining": "n/a",
                        f"{axis}_used": used[axis]})
            continue
        if axis == "seconds" and float(total).is_integer():
            total = int(total)  # "600s", not "600.0s"
        left: Any = max(0, total - used[axis])
        out.update({f"{axis}_total": total, f"{axis}_used": used[axis],
                    f"{axis}_remaining": int(left) if axis == "seconds" else (
                        round(left, 6) if axis == "cost" else left)})
    return out


class Cut(NamedTuple):
    """An upstream leg the episode's time budget ended: whether the answer's head, and some of
    its body, had gone out by then."""

    started: bool
    sent_body: bool


async def within_deadline(
    deadline: float, leg: Callable[[Send], Awaitable[T]], send: Send,
) -> T | Cut:
    """Run the upstream leg until the episode's time budget ends, and return what it returns.
    Cut mid-answer, the response is closed cleanly where it stands (the client has a well-ended
    HTTP body); cut before the answer began, nothing was sent: the caller answers (forward.py
    `_out_of_time`)."""
    sent = {"start": False, "body": False, "closed": False}

    async def tracked(message: Message) -> None:
        if message["type"] == "http.response.start":
            sent["start"] = True
        elif message["type"] == "http.response.body":
            sent["body"] = sent["body"] or bool(message.get("body"))
            sent["closed"] = not message.get("more_body", False)
        await send(message)

    try:
        async with asyncio.timeout(max(0.0, deadline - time.time())):
            return await leg(tracked)
    except TimeoutError:
        if sent["start"] and not sent["closed"]:
            with contextlib.suppress(Exception):
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        return Cut(sent["start"], sent["body"])
