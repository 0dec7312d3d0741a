"""Model calls: each admitted (admission.py, turns.py) into a Plan, and forwarded as it says,
its answer settled and recorded (settlement.py) on every path out."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from budgetproxy.config import Config, UpstreamConfig
from budgetproxy.core.budget import tier_label
from budgetproxy.core.forwarded_headers import HeaderPolicy
from budgetproxy.core.paths import wire_query
from budgetproxy.core.prefixes import Prefixes
from budgetproxy.core.prices import PriceTable
from budgetproxy.errors import ProxyError, invalid_request
from budgetproxy.proxy import axis_calls, capture, outcome, spliced
from budgetproxy.proxy.admission import Admission
from budgetproxy.proxy.asgi import ClientGone, Receive, Scope, Send, read_body, send_error
from budgetproxy.proxy.calls import (
    PROBE_HEADER,
    ModelCall,
    exact_payload_for,
    with_stream_usage,
)
from budgetproxy.proxy.dialects import DIALECTS
from budgetproxy.proxy.episode_keys import EpisodeKeys
from budgetproxy.proxy.experiments import Experiments
from budgetproxy.proxy.refusal import refusal_status
from budgetproxy.proxy.settlement import Settlement
from budgetproxy.proxy.turns import Plan, Turns
from budgetproxy.proxy.upstream import UpstreamPool
from budgetproxy.proxy.upstream_call import Leg, UpstreamCall
from budgetproxy.proxy.wire import encode_exact
from budgetproxy.store.base import EpisodeStore
from budgetproxy.store.groups import GroupStore
from budgetproxy.telemetry.metrics import Metrics
from budgetproxy.telemetry.tracing import Tracing
from budgetproxy.trajectories.recorder import Recorder

log = logging.getLogger("budgetproxy")

__all__ = ["ModelCalls", "Plan"]


class ModelCalls:
    """The hot path for POST /v1/chat/completions, /completions, /responses, /messages."""

    def __init__(
        self,
        config: Config,
        pool: UpstreamPool,
        store: EpisodeStore,
        recorder: Recorder,
        metrics: Metrics | None,
        tracing: Tracing,
        litellm_call: Callable[..., Any] | None = None,
        *,
        groups: GroupStore | None = None,
        episode_keys: EpisodeKeys | None = None,
        experiments: Experiments | None = None,
    ) -> None:
        self.metrics = metrics
        self.tracing = tracing
        self.budget_cfg = config.budget
        self.max_body = config.server.max_body_bytes
        prices = PriceTable({g: p.model_dump() for g, p in config.prices.items()})
        self.settlement = Settlement(config, store, recorder, metrics, tracing, prices)
        self.turns = Turns(config, pool, store, recorder, metrics, self.settlement, prices,
                           groups=groups, experiments=experiments)
        self.admission = Admission(config, pool, metrics, episode_keys, self.turns.prefixes)
        self.upstream = UpstreamCall(
            pool, metrics, tracing, litellm_call,
            header_policy=HeaderPolicy(config.server.forward_headers,
                                       (*self.admission.id_headers, PROBE_HEADER)),
            own_keys=self.admission.keys.required)

    @property
    def prefixes(self) -> Prefixes:
        """Each recent episode's last conversation (core/prefixes.py)."""
        return self.turns.prefixes

    async def handle(
        self, scope: Scope, receive: Receive, send: Send, route: str, path_episode: str | None
    ) -> None:
        call = ModelCall(route, DIALECTS[route])
        query = scope.get("query_string")
        if query:
            call.query = wire_query(query)
        try:
            await self._handle(call, scope, receive, send, path_episode)
        except ClientGone:
            call.outcome = outcome.unanswered(call.outcome, 499)
        except ProxyError as e:
            call.outcome = outcome.unanswered(call.outcome, e.status)
            if not call.started:
                await send_error(send, e, self.settlement.episode_headers(call),
                                 call.dialect.error_body)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("unexpected error on %s", route)
            call.outcome = outcome.unanswered(call.outcome, 500)
            if not call.started:
                await send_error(
                    send,
                    ProxyError(500, "internal_error", "The proxy failed on this request; "
                               "it has been logged.", type_="api_error"),
                    None, call.dialect.error_body,
                )
        finally:
            if self.metrics is not None:
                total = time.perf_counter() - call.t0
                duration, overhead, requests = self.metrics.call_children(
                    route, call.outcome.http_status)
                duration.observe(total)
                requests.inc()
                if call.upstream is not None:
                    overhead.observe(max(0.0, total - call.t_upstream))

    async def _handle(
        self, call: ModelCall, scope: Scope, receive: Receive, send: Send, path_episode: str | None
    ) -> None:
        """Admission, one step each: the key and the episode id (admission.py), the body
        parsed and validated, the upstream for its model, whether it is counted, its turn
        opened and the body rewritten (turns.py); the `Plan` it gives is forwarded."""
        headers, eid, probe = self.admission.caller(scope, path_episode)
        body = await read_body(receive, headers, self.max_body)
        payload, upstream, counted, conversation = self.admission.parse(call, body, eid)
        call.episode_id = eid
        if not counted:
            kept = self.admission.uncounted(call, payload, conversation, probe)
            await self._forward(call, Plan(upstream, headers, body, payload, kept), receive, send)
            return
        plan = await self.turns.take(call, upstream, headers, body, payload, conversation, send)
        if plan is not None:  # (None: answered here, its budget spent)
            await self._forward(call, plan, receive, send)

    # -- forwarding ----------------------------------------------------------------------------

    async def _forward(self, call: ModelCall, plan: Plan, receive: Receive, send: Send) -> None:
        """Forward the call as `plan` says, keep what its leg returns, then send a whole answer,
        settle and record it (settlement.py `Settlement.conclude`) on every path out: errors
        and cancellation included."""
        upstream, headers, body, payload, conversation = plan
        call.upstream = upstream
        drop_usage = False
        if call.stream and upstream.inject_stream_usage and call.dialect.stream_usage:
            body, payload, conversation, drop_usage = self._stream_usage(
                call, body, payload, conversation)
        if upstream.capture_tokens and call.dialect.kind in capture.CAPTURED_KINDS:
            body, payload = self._capture(call, upstream, body, payload)
        call.conversation = conversation
        if conversation is not None:
            call.sent = payload  # (disclosure texts included; read when a kept turn needs it)
        call.span = self.tracing.start(call.kind, call.model, headers, call.episode_id)
        try:
            body = body or self._encode(call, payload)
            call.upstream_body = body
            # The leg: the upstream's own client, or litellm, or either within the episode's
            # time budget when that ends before the upstream's own timeout (`_leg_in_time`;
            # a deadline past it cannot end this call: no timer). A stream's head carries the
            # X-Episode-* headers, read before it; a whole answer comes back unsent.
            grant = call.grant
            if grant is not None and grant.hold is not None and grant.hold.deadline and (
                    upstream.kind == "litellm"
                    or grant.hold.deadline - time.time() < upstream.timeout_s):
                leg = await self._leg_in_time(call, upstream, headers, body, payload, receive,
                                              send, drop_usage, grant.hold.deadline)
            elif upstream.kind == "litellm":
                leg = await self.upstream.litellm(call, upstream, payload)
            else:
                leg = await self.upstream.http(
                    call, upstream, headers, body, receive, send, drop_usage,
                    self.settlement.episode_headers(call) if call.stream else None)
            if leg is not None:  # kept on the call: its record, headers and settle read it
                call.leg, call.outcome = leg, leg.outcome
                call.started, call.t_upstream = leg.started, leg.t_upstream
                call.data, call.events = leg.data, leg.events
                if leg.tokens is not None:
                    call.tokens, call.answer = leg.tokens, leg.answer
                if leg.error is not None:  # (settled and recorded before it is answered)
                    raise leg.error
        except asyncio.CancelledError:
            # The server cancels calls still running at its shutdown deadline; one whose answer
            # had not begun gets a 503 (app.py) and, like an upstream failure, its turn back.
            if not call.started:
                call.outcome = outcome.refused(503)
            raise
        finally:
            await self.settlement.conclude(call, upstream, conversation, send)

    def _stream_usage(
        self, call: ModelCall, body: bytes, payload: dict[str, Any],
        conversation: list[Any] | None,
    ) -> tuple[bytes, dict[str, Any], list[Any] | None, bool]:
        """A stream's body asking for the usage chunk the client did not ask for (the proxy
        reads it, and drops it from what the client gets: True)."""
        so = payload.get("stream_options")
        if body and "stream_options" not in payload:
            # Added to the body's bytes, which stay as sent: no re-encoding, and no walk of
            # the payload for integers re-encoding would change.
            payload["stream_options"] = {"include_usage": True}
            return with_stream_usage(body), payload, conversation, True
        if isinstance(so, dict) and so.get("include_usage"):
            return body, payload, conversation, False
        checked = self.turns.prefixes.others
        exact = exact_payload_for(call, body, payload, checked) if body else None
        if exact is not None:
            payload, so = exact, exact.get("stream_options")
            if conversation is not None:
                conversation = call.dialect.conversation(exact)
        payload["stream_options"] = {**(so if isinstance(so, dict) else {}),
                                     "include_usage": True}
        return b"", payload, conversation, True

    def _capture(
        self, call: ModelCall, upstream: UpstreamConfig, body: bytes, payload: dict[str, Any]
    ) -> tuple[bytes, dict[str, Any]]:
        """Ask for token ids and logprobs the client did not ask for (capture_tokens)."""
        cap, add = capture.plan(payload, call.dialect.kind, upstream.token_server)
        call.capture = cap
        if not add:
            return body, payload
        if body and not add.keys().isdisjoint(payload):  # re-encoded: integers stay exact
            exact = exact_payload_for(call, body, payload, self.turns.prefixes.others)
            if exact is not None:
                payload = exact
        return capture.add_fields(body, payload, add, cap.members), payload

    async def _leg_in_time(
        self, call: ModelCall, upstream: UpstreamConfig, headers: dict[bytes, bytes],
        body: bytes, payload: dict[str, Any], receive: Receive, send: Send, drop_usage: bool,
        deadline: float,
    ) -> Leg | None:
        """The leg until the episode's time budget ends (None: it ended before the answer's
        head, and the call is answered here)."""
        episode_head = self.settlement.episode_headers(call) if call.stream else None

        def leg(out: Send) -> Awaitable[Leg]:
            if upstream.kind == "litellm":
                return self.upstream.litellm(call, upstream, payload)
            return self.upstream.http(call, upstream, headers, body, receive, out,
                                      drop_usage, episode_head)

        ran = await axis_calls.within_deadline(deadline, leg, send)
        if isinstance(ran, axis_calls.Cut):
            await self._out_of_time(call, ran, send, refusal_status(headers))
            return None
        return ran

    async def _out_of_time(
        self, call: ModelCall, cut: axis_calls.Cut, send: Send, refused: int
    ) -> None:
        """The episode's time budget ended the leg. Mid-answer, the answer stands as far as it
        went (charged if any of its body reached the client). Before it: answered as a spent
        budget (a refusal, or in finish mode the final reply), its turn given back; the turn
        record follows as for every forwarded call."""
        call.timed_out = True
        if cut.started:
            call.started = True
            call.outcome = outcome.deadline_cut(call.outcome, cut.sent_body)
            return
        st = call.state
        assert st is not None
        st.exhausted_by = st.exhausted_by or "time"
        if self.metrics is not None:
            self.metrics.budget_exhausted.labels(tier_label(st.budget, st.max_turns),
                                                 st.disclosure).inc()
        call.outcome = outcome.out_of_time(refused)
        if self.budget_cfg.on_exhausted != "finish":
            raise axis_calls.axis_exhausted(st, refused)
        await self.turns.final_reply(call, st, send, refused)

    @staticmethod
    def _encode(call: ModelCall, payload: dict[str, Any]) -> bytes:
        """The rewritten body's bytes. What the proxy parsed it can write, except nesting past
        orjson's 254 levels (in a body with no integer past 64 bits, which the standard
        library writes instead): that call is refused, its turn given back, its record kept.
        A disclosed turn's body is written from the previous turn's where its placed messages
        start with that turn's (proxy/spliced.py), and kept for the next."""
        into, placed = call.sent_body, call.placed
        if into is not None and placed is not None and not call.exact and (
                payload.get("messages") is placed.messages):
            previous = call.extends
            body = spliced.spliced(payload, placed.base, None if previous is None
                                   else previous.sent, into)
            if body is not None:
                return body
            body = spliced.written(payload, into)
            if body is not None:
                return body
        try:
            return orjson.dumps(payload)
        except (TypeError, ValueError):
            pass
        if call.exact:  # integers past 64 bits, which only the standard library writes
            with contextlib.suppress(ValueError, RecursionError):
                return encode_exact(payload)
        call.outcome = outcome.refused(400)
        raise invalid_request("Request body nests arrays and objects too deeply to be "
                              "rewritten (at most 254 levels)")
