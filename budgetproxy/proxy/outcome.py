"""What a model call came to: every rule that decides its status, HTTP status and settle result.

A call's `Outcome` is a value chosen here from what happened (the upstream's status, a failure
before the answer, how a stream ended, a refusal, a deadline); forward.py keeps it on the call,
and the settle (core/episode.py `settle`), the turn record, the metrics and the span read it.
"""

from __future__ import annotations

from typing import NamedTuple

from budgetproxy.core.episode import SettleResult
from budgetproxy.proxy.relay import StreamEnd


class Outcome(NamedTuple):
    status: str  # the record's: ok, upstream_error, client_closed, rejected, synthetic
    http_status: int  # what the client was answered (499: it left before any head)
    result: SettleResult  # how its turn settles: REFUNDABLE gives it back
    error_class: str | None = None  # the upstream's failure (the metric's label)


ANSWERED = Outcome("ok", 200, SettleResult.OK)


def answered(http_status: int) -> Outcome:
    """An upstream's whole answer: 429 and 5xx are the upstream's fault (the turn given back),
    other 4xx the request's (charged)."""
    if http_status == 429 or http_status >= 500:
        return Outcome("upstream_error", http_status, SettleResult.REFUNDABLE,
                       "status_429" if http_status == 429 else "status_5xx")
    if http_status >= 400:
        return Outcome("upstream_error", http_status, SettleResult.OK, "status_4xx")
    return ANSWERED if http_status == 200 else Outcome("ok", http_status, SettleResult.OK)


def failed(error_class: str) -> Outcome:
    """No answer from the upstream (connect, timeout, protocol, redirect): a 502 or 504, the
    turn given back."""
    return Outcome("upstream_error", 504 if error_class == "timeout" else 502,
                   SettleResult.REFUNDABLE, error_class)


def refused(http_status: int) -> Outcome:
    """The proxy answers the call itself (a spent budget, a shutdown, a body it cannot write):
    its turn, if it took one, is given back."""
    return Outcome("rejected", http_status, SettleResult.REFUNDABLE)


def stream_ended(end: StreamEnd, started: bool, sent_body: bool) -> Outcome:
    """A relayed stream. A client that hung up is no upstream fault: what it had been sent is
    its status (499, nginx's "client closed request", when not even the head went out), and
    its turn is given back if no event reached it. A break charges the turn only if an event
    reached the client; one before the head is answered 502."""
    if end is StreamEnd.CLIENT_GONE:
        return Outcome("client_closed", 200 if started else 499,
                       SettleResult.OK if sent_body else SettleResult.REFUNDABLE)
    if end is StreamEnd.BROKEN:
        return Outcome("upstream_error", 200 if started else 502,
                       SettleResult.BROKEN if sent_body else SettleResult.REFUNDABLE,
                       "stream_broken")
    return ANSWERED


def deadline_cut(before: Outcome, sent_body: bool) -> Outcome:
    """An answer the episode's time budget cut after its head went out: it keeps its status,
    and its turn is charged only if some of its body reached the client."""
    return before._replace(
        result=SettleResult.BROKEN if sent_body else SettleResult.REFUNDABLE,
        error_class="time_budget")


def out_of_time(http_status: int) -> Outcome:
    """A call the episode's time budget ended before its answer's head: answered as a spent
    budget (`http_status`, or finish mode's final reply), its turn given back."""
    return Outcome("rejected", http_status, SettleResult.REFUNDABLE, "time_budget")


def exhausted(http_status: int) -> Outcome:
    """A call its episode has no budget for: refused (or given finish mode's final reply); it
    took no turn, so nothing settles."""
    return Outcome("rejected", http_status, SettleResult.OK)


def final_reply(before: Outcome) -> Outcome:
    """Finish mode's final reply in place of a refusal: the client has a 200."""
    return before._replace(status="synthetic", http_status=200)


def unanswered(before: Outcome, http_status: int) -> Outcome:
    """A call that ended in an error the proxy answered (or a client gone before its body
    arrived, 499): the status the request metric counts."""
    return before._replace(http_status=http_status)
