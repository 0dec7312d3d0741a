"""A model call's end: its turn settled and its records written, in the order the path keeps.

forward.py calls `Settlement.conclude` once the upstream leg is over (or failed), with what the
call's phases returned (its grant, the leg's `Leg` and `Outcome`) kept on its ModelCall; a
whole answer, which the leg returns unsent, is sent there, after its turn's settle when that
gives the turn back.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable
from typing import Any

from budgetproxy.config import Config, UpstreamConfig
from budgetproxy.core.episode import GrantKind, SettleResult
from budgetproxy.core.prices import PriceTable
from budgetproxy.core.tenants import local_id
from budgetproxy.core.usage import token_counts
from budgetproxy.proxy import axis_calls, capture
from budgetproxy.proxy.asgi import Send, send_response
from budgetproxy.proxy.calls import ModelCall, compaction_record, probe_record, turn_record
from budgetproxy.proxy.dialects import Reply
from budgetproxy.proxy.grouping import RolloutRecorder
from budgetproxy.store.base import EpisodeStore, StoreUnavailable, TurnClose
from budgetproxy.telemetry.metrics import Metrics
from budgetproxy.telemetry.tracing import Tracing
from budgetproxy.trajectories.recorder import Recorder

log = logging.getLogger("budgetproxy")


class Settlement:
    """Settles model calls' turns (`EpisodeStore.close_turn`, core/episode.py `settle`'s rule)
    and writes their records; the X-Episode-* headers an answer carries are read here too,
    since what they report as left depends on how the turn settles."""

    def __init__(
        self, config: Config, store: EpisodeStore, recorder: Recorder, metrics: Metrics | None,
        tracing: Tracing, prices: PriceTable,
    ) -> None:
        self.store = store
        self.recorder = recorder
        self.metrics = metrics
        self.tracing = tracing
        self.prices = prices
        self.budget_cfg = config.budget
        self.budget_headers = config.episodes.budget_headers

    async def conclude(
        self, call: ModelCall, upstream: UpstreamConfig, conversation: list[Any] | None,
        send: Send,
    ) -> None:
        """Send a whole answer the leg returned unsent, settle the call's turn, then write its
        records, once the leg is over (or failed).

        The two ordering rules of the model-call path:
        1. A refundable answer's turn is given back before the client has the answer, when its
           head was not sent yet, so a retry sent at once finds the turn free: a whole answer's
           turn is settled here before it is sent; a failure (the leg's `error`, a refusal) is
           settled here, before forward.py's `handle` answers the error.
        2. The turn record is written before the episode's end record: an episode ended while
           this turn was in flight is ended by this turn's settle (`call.ended`), and its
           `episode` record follows the turn's own.
        A turn-only call's settle is awaited after its record (`_settle`); a call with other
        budgets awaits it first, for the spend its record carries."""
        try:
            leg = call.leg
            if leg is not None and leg.head is not None:  # a whole answer, not yet sent
                head = leg.head
                head.extend(self.episode_headers(call))  # (as left once it settles)
                if leg.outcome.result is SettleResult.REFUNDABLE:  # rule 1
                    closing = await self._settle(call)
                    if closing is not None:
                        await self._closed(call, closing)
                await send_response(send, leg.outcome.http_status, head, leg.body)
        finally:
            early = axis_calls.read_reply(call) if (
                call.grant is not None and call.grant.hold is not None) else None
            closing = await self._settle(call, early)
            try:
                reply = await self._after(call, early)
            finally:
                if closing is not None:  # a turn-only call's settle, answered after its record
                    await self._closed(call, closing)
            if call.probe is not None and self.recorder.keeps_turns:
                await self.recorder.probe(probe_record(call, reply))
            elif call.compaction and call.grant is None and self.recorder.writes_turns:
                await self.recorder.probe(compaction_record(call, reply))
            if call.ended is not None:  # after its last turn's record (rule 2)
                await self.recorder.episode_ended(call.ended)
            if call.span is not None and call.span.sampled:
                grant = call.grant
                charged, remaining = self._settled(call, grant is not None and grant.charged)
                self.tracing.finish(
                    call.span, kind=call.kind, model=call.model, upstream=upstream,
                    episode_id=call.episode_id, state=call.state, grant=grant,
                    charged=charged, remaining=remaining, status=call.outcome.http_status,
                    error_class=call.outcome.error_class, reply=reply,
                    conversation=conversation,
                )

    def episode_headers(self, call: ModelCall) -> list[tuple[bytes, bytes]]:
        """The X-Episode-* headers of the call's answer (or error): what is left is reported as
        it will be once the call settles (a refunded turn counted back)."""
        st, grant = call.state, call.grant
        if st is None or call.episode_id is None:
            return []
        out = [(b"x-episode-id", local_id(call.episode_id).encode())]
        # Only a turn taken has a number: a call refused (or answered by the proxy's final
        # reply) took none (its log record says which it would have been).
        if grant is not None and grant.kind is GrantKind.FORWARD:
            out.append((b"x-episode-turn", b"%d" % grant.turn))
        if call.warning is not None:
            out.append((b"x-episode-warning", call.warning))
        if st.arm is not None:
            out.append((b"x-episode-arm", st.arm.encode()))
        mode = self.budget_headers
        if mode == "always" or (mode == "disclosed_only" and st.disclosure == "disclosed"):
            remaining = st.remaining
            if self._refunded(call):
                remaining = min(st.budget, remaining + 1)
            out.append((b"x-episode-budget", b"%d" % st.budget))
            out.append((b"x-episode-remaining", b"%d" % remaining))
            # (none on a turn-only episode; a forwarded call's whole answer, read before its
            # head, reports what is left once it settles)
            axis_calls.add_remaining_headers(out, st if grant is None or grant.hold is None
                                             or call.data is None
                                             else axis_calls.as_settled(self.prices, call, st))
        return out

    async def _settle(
        self, call: ModelCall, reply: Reply | None = None
    ) -> Awaitable[TurnClose] | None:
        """Settle the call's turn. A turn-only call's settle is returned unawaited: the turn's
        record needs nothing from it, and the Redis store has sent it already (its reply and
        the record's writes share a round trip); `_closed` awaits it after the record."""
        grant = call.grant
        if grant is None or call.episode_id is None or grant.kind is not GrantKind.FORWARD:
            return None
        if call.settled:
            return None
        call.settled = True
        try:
            now = time.time()
            spend = axis_calls.spend(self.prices, call, reply) if (
                grant.hold is not None) else None
            closing = self.store.close_turn(
                call.episode_id, grant, call.outcome.result, now,
                count_failed=self.budget_cfg.count_failed_turns,
                spend=spend, timed_out=call.timed_out,
            )
            if grant.hold is None:
                return closing
            closed = await closing
            call.cumulative = closed.spent
            if closed.ended:  # the episode ended meanwhile and waited for this turn
                call.ended = closed.state
        except StoreUnavailable:
            log.warning("store unavailable while settling turn of %s", call.episode_id)
        return None

    async def _closed(self, call: ModelCall, closing: Awaitable[TurnClose]) -> None:
        try:
            closed = await closing
        except StoreUnavailable:
            log.warning("store unavailable while settling turn of %s", call.episode_id)
            return
        if closed.ended:  # the episode ended meanwhile and waited for this turn
            call.ended = closed.state

    async def _after(self, call: ModelCall, reply: Reply | None = None) -> Reply:
        """Read the reply back for tokens and the log (unless `reply` is it, read before
        settling); runs once the client has its answer."""
        if reply is None:
            reply = axis_calls.read_reply(call)
        if call.capture is not None and call.tokens is None:
            call.tokens = (capture.read_events(call.events) if call.events is not None
                           else capture.read_body(call.data) if call.data else None)
        usage = reply.get("usage")
        m = self.metrics
        if m is not None and isinstance(usage, dict):
            tokens_in, tokens_out = m.token_children(call.model)
            tin, tout = call.counts or token_counts(usage)
            if tin is not None:
                tokens_in.inc(tin)
            if tout is not None:
                tokens_out.inc(tout)
        grant, st = call.grant, call.state
        if grant is None or st is None:
            return reply
        charged = grant.charged and not self._refunded(call)
        if charged and m is not None:
            m.turns_child(st.budget, st.max_turns, st.disclosure).inc()
            tenant = m.tenant_label(st.episode_id)
            if tenant is not None:
                m.tenant_turns.labels(tenant).inc()
        await self.record_turn(call, call.conversation, reply, charged=grant.charged)
        return reply

    async def record_turn(
        self, call: ModelCall, conversation: list[Any] | None, reply: dict[str, Any] | None,
        *, charged: bool,
    ) -> None:
        st = call.state
        rec = self.recorder
        if st is None or call.episode_id is None or not rec.keeps_turns:
            return
        if rec.writes_turns:  # the trajectory log's record
            charged, remaining = self._settled(call, charged)
            await rec.turn(turn_record(call, st, conversation, reply, charged, remaining))
        if call.outcome.status == "ok" and isinstance(rec, RolloutRecorder):  # the trajectory API
            await rec.keep(call, st, reply)

    def _settled(self, call: ModelCall, charged: bool) -> tuple[bool, int | None]:
        """Whether a turn reserved as `charged` stays charged once settled (a refunded one does
        not), and the turns its episode has left after it: what its log record and span say."""
        st = call.state
        if st is None:
            return charged, None
        if charged and self._refunded(call):
            return False, min(st.budget, st.remaining + 1)
        return charged, st.remaining

    def _refunded(self, call: ModelCall) -> bool:
        """Whether settling gives this call's turn back (core.episode.settle's rule)."""
        return (
            call.outcome.result is SettleResult.REFUNDABLE and call.grant is not None
            and call.grant.charged and not self.budget_cfg.count_failed_turns
        )
