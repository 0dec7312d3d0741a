"""A counted call's turn: reserved in one atomic store step and its body rewritten for it
(its arm's model, its output cap, its disclosure texts) into the Plan forward.py sends, or
refused, or answered here when its budget is spent."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Awaitable
from functools import partial
from typing import Any, NamedTuple

from budgetproxy.config import Config, UpstreamConfig
from budgetproxy.core import axes, disclosure, prefixes
from budgetproxy.core.budget import tier_label
from budgetproxy.core.episode import EpisodeState, Grant, GrantKind
from budgetproxy.core.fingerprint import Fingerprint
from budgetproxy.core.finish import finish_text
from budgetproxy.core.prefixes import Prefix, Prefixes, SentBody
from budgetproxy.core.prices import PriceTable
from budgetproxy.core.replays import Replays
from budgetproxy.core.spec import EpisodeSpec, SpecError, new_episode
from budgetproxy.core.tenants import local_id
from budgetproxy.errors import (
    ProxyError,
    budget_exhausted,
    episode_finished,
    invalid_request,
)
from budgetproxy.proxy import axis_calls, outcome
from budgetproxy.proxy.asgi import Send, send_response
from budgetproxy.proxy.calls import ModelCall, exact_payload_for, turn_hash
from budgetproxy.proxy.experiments import EXPERIMENT_HEADER, Assigned, Experiments, NeedArm
from budgetproxy.proxy.grouping import group_key, group_size
from budgetproxy.proxy.refusal import refusal_status
from budgetproxy.proxy.settlement import Settlement
from budgetproxy.proxy.sse import EventSplitter
from budgetproxy.proxy.upstream import UpstreamPool
from budgetproxy.proxy.wire import has_lossy_float, ignored_spec_headers, spec_from_headers
from budgetproxy.store.base import EpisodeStore, StoreBusy, StoreUnavailable, TurnOpen
from budgetproxy.store.groups import GroupStore
from budgetproxy.telemetry.metrics import Metrics
from budgetproxy.trajectories.recorder import Recorder

log = logging.getLogger("budgetproxy")

STORE_DOWN_LOG_EVERY_S = 10.0


class Plan(NamedTuple):
    """What admission decided for a call it lets through (forward.py `_handle` → `_forward`);
    the call's route, dialect, model, episode and grant are on its ModelCall."""

    upstream: UpstreamConfig  # the upstream that serves the model (or the arm's model)
    headers: dict[bytes, bytes]  # the client's request headers
    body: bytes  # the bytes to send as they are; b"": `payload` was rewritten, encode it
    payload: dict[str, Any]  # the body as parsed (and rewritten)
    conversation: list[Any] | None  # the client's conversation for its record (None: none)


class Turns:
    """Opens counted calls' turns; keeps, per recent episode, what its next turn reuses."""

    def __init__(
        self, config: Config, pool: UpstreamPool, store: EpisodeStore, recorder: Recorder,
        metrics: Metrics | None, settlement: Settlement, prices: PriceTable, *,
        groups: GroupStore | None, experiments: Experiments | None,
    ) -> None:
        self.pool = pool
        self.store = store
        self.recorder = recorder
        self.metrics = metrics
        self.settlement = settlement
        self.prices = prices
        self.groups = groups
        self.experiments = experiments
        self._store_down_logged_at = float("-inf")
        # The last choice of earlier texts to re-apply, per recent episode (core/replays.py).
        self.replays = Replays()
        # Each recent episode's last conversation, for its next turn to hash and check only
        # what it adds (core/prefixes.py).
        self.prefixes = Prefixes()
        # (an ended episode has no next turn)
        recorder.forget += (self.prefixes.drop, self.replays.drop)
        self.budget_cfg = config.budget
        self.disc_cfg = config.disclosure
        self.finish_texts = config.budget.finish_texts.model_dump()
        # whether the disclosure text tells the other axes (its fields change every turn)
        self.tells_axes = any(disclosure.uses_axes(t) for t in (
            config.disclosure.template,
            *(a.template for e in config.experiments for a in e.arms if a.template)))
        self.fail_open = config.store.on_unavailable == "fail_open"

    async def take(
        self, call: ModelCall, upstream: UpstreamConfig, headers: dict[bytes, bytes],
        body: bytes, payload: dict[str, Any], conversation: list[Any], send: Send,
    ) -> Plan | None:
        """Open the call's turn. A FORWARD grant gives the call's plan, its body rewritten for
        the turn; a finished episode or a held budget is refused; a spent budget is answered
        here (None). A store down under fail_open forwards the call as sent, uncounted."""
        eid = call.episode_id
        assert eid is not None
        call.previous_response = call.dialect.continues(payload)
        grant, st = await self._open_turn(call, eid, headers, body, conversation)
        if grant is None:  # store down, fail_open
            return Plan(upstream, headers, body, payload, None)
        if grant.kind is GrantKind.FINISHED:
            raise episode_finished(local_id(eid), refusal_status(headers))
        if grant.kind is GrantKind.HELD:
            raise axis_calls.held(st)
        if grant.kind is GrantKind.EXHAUSTED:
            await self._exhausted(call, st, send, conversation, refusal_status(headers))
            return None
        # The turn's body: its output cap clamped to what other budgets leave, its arm's
        # model, its disclosure text. Each rewrite leaves `body` empty (`payload` is encoded
        # then); the hidden arm's turn goes as the client sent it.
        cap = None if grant.hold is None else axis_calls.sent_cap(call, grant.hold)
        if cap == 0:  # several completions, less than a token each: its turn given back
            call.outcome = outcome.refused(400)
            call.upstream, call.conversation = upstream, conversation
            await self.settlement.conclude(call, upstream, conversation, send)
            raise axis_calls.too_few_tokens(st, call)
        if cap is not None:
            payload = axis_calls.clamped(call, self._exact(call, body, payload) or payload, cap)
            conversation, body = call.dialect.conversation(payload), b""
        if st.arm is not None and self.experiments is not None:
            routed = self._arm_upstream(call, st)
            if routed is not None:  # the arm's model instead
                upstream, arm_model = routed
                exact = self._exact(call, body, payload) if body else None
                payload = dict(exact or payload)
                payload["model"] = call.model = arm_model
                body = b""
        if st.disclosure == "disclosed" and call.dialect.discloses:
            payload, conversation = self._disclosed(call, body, payload, conversation, grant, st)
            body = b""
        text = call.disclosure_text
        if text is not None and grant.hold is not None and self.tells_axes and (
                self.disc_cfg.history == "keep" and call.previous_response is None):
            # Kept for later turns to re-apply as it was: its axis fields change every turn.
            await axis_calls.keep_told(self.store, eid, grant.turn, text)
        self._keep_prefix(call, eid, grant, conversation, upstream)
        return Plan(upstream, headers, body, payload, conversation)

    def _exact(self, call: ModelCall, body: bytes,
               payload: dict[str, Any]) -> dict[str, Any] | None:
        """calls.exact_payload_for, with the other values this process has checked."""
        return exact_payload_for(call, body, payload, self.prefixes.others)

    def _arm_upstream(
        self, call: ModelCall, st: EpisodeState
    ) -> tuple[UpstreamConfig, str] | None:
        """The upstream and model of the episode's experiment arm, when it names a model other
        than the one asked for, which an upstream serves (None: the call's own)."""
        assert self.experiments is not None
        arm_model = self.experiments.model_of(st)
        routed = None if arm_model is None else self.pool.route(arm_model)
        if routed is not None and routed.kind == "litellm" and not call.dialect.via_litellm:
            routed = None  # (a litellm upstream serves chat only: the model asked for)
        if routed is None or arm_model is None or arm_model == call.model:
            return None
        return routed, arm_model

    def _disclosed(
        self, call: ModelCall, body: bytes, payload: dict[str, Any], conversation: list[Any],
        grant: Grant, st: EpisodeState,
    ) -> tuple[dict[str, Any], list[Any]]:
        """The disclosed arm: this turn's text, and the earlier ones to re-apply, placed in
        the conversation by the dialect (the payload to send, and its conversation)."""
        exact = self._exact(call, body, payload) if body else None
        if exact is not None:
            payload, conversation = exact, call.dialect.conversation(exact)
        # Earlier texts go back only where this conversation still extends the one they
        # were placed in: a client that rewrote its history gets none on what it replaced.
        # A call continuing a stored response sends only its new input: the earlier
        # texts are in what the upstream stored.
        cfg = self.disc_cfg
        keep = cfg.history == "keep" and call.previous_response is None
        # (a template without axis fields renders as on a turn-only episode: cached)
        fields = axis_calls.template_fields(st, time.time()) if (
            grant.hold is not None and self.tells_axes) else None
        template = cfg.template
        if st.arm is not None and self.experiments is not None:
            template = self.experiments.template_of(st) or template
        eid = call.episode_id
        assert eid is not None
        chosen = (self.replays.replayable(eid, grant.disclosed_at, call.prints)
                  if keep and call.prints is not None else None)
        text, again = disclosure.texts(
            template, grant.turn, st.budget, st.announced_budget, chosen=chosen,
            fields=fields, told=st.told)
        call.disclosure_text = text
        # (only from a previous turn read without loss: an integer past 64 bits that the
        # client changed reads as the same float, so equal bytes would not prove it equal)
        extended = call.extends
        previous = extended.placed if extended is not None and extended.lossless else None
        proven = call.raw_proven if call.raw_from is extended else 0
        payload, call.placed = call.dialect.place(payload, conversation, cfg.placement, text,
                                                  again, previous, proven)
        return payload, conversation

    async def _open_turn(
        self, call: ModelCall, eid: str, headers: dict[bytes, bytes], body: bytes,
        conversation: list[Any],
    ) -> tuple[Grant | None, EpisodeState]:
        """Reserve the call's turn in one atomic store step (None for the grant: the store is
        down and fail_open forwards the call uncounted)."""
        now = time.time()
        # The state a first call creates its episode with, asked for within the store's open.
        fresh = partial(self._new_episode, call, eid, headers, now, None)
        count = len(conversation)
        keep = (self.disc_cfg.history == "keep" and call.dialect.discloses
                and call.previous_response is None)
        index = call.dialect.placement_index(self.disc_cfg.placement, conversation) if (
            keep) else None
        # The digest of what this turn sends: the log and history-keep disclosure compare
        # the next turn's conversation with it (one write and one hash of the messages).
        if self.recorder.keeps_turns or keep:
            call.prints = self._fingerprint(call, eid, conversation)
        fingerprint = call.prints.digest() if call.prints is not None else None
        # what this process already holds of the episode's placements (core/replays.py)
        known = self.replays.known(eid, call.prints) if (
            keep and call.prints is not None) else None
        model = call.model or ""
        cap = axis_calls.client_cap(call, self.budget_cfg.output_hold_tokens)
        body_hash = turn_hash(call.route, body)

        def open_turn(out_rate: float | None) -> Awaitable[TurnOpen]:
            return self.store.open_turn(
                eid, fresh, body_hash, now, free_retries=self.budget_cfg.free_retries_per_turn,
                message_count=count, disclosure_index=index, model=call.model,
                fingerprint=fingerprint, client_cap=cap,
                output_hold=self.budget_cfg.output_hold_tokens, out_rate=out_rate,
                placements_known=known)

        try:
            try:
                opened = await open_turn(self.prices.cached_output_rate(model))
            except NeedArm as need:  # a new episode in an experiment: draw its arm, again
                fresh = partial(self._new_episode, call, eid, headers, now, await self._draw(need))
                opened = await open_turn(self.prices.cached_output_rate(model))
            if opened.grant.kind is GrantKind.NEED_PRICE:  # a cost budget: once per model
                created = opened.created
                rate = await axis_calls.output_rate(self.prices, model)
                opened = axis_calls.reopened(await open_turn(rate), created)
        except StoreUnavailable as e:
            self._store_down(e, now)  # (a 503 unless fail_open)
            try:
                return None, fresh()
            except NeedArm as need:  # (the store was down before it was asked for one)
                return None, self._new_episode(call, eid, headers, now, await self._draw(need))
        if opened.created:
            await self._created(opened.state, group_size(headers))
        else:
            call.warning = ignored_spec_headers(headers, opened.state)
        call.state = opened.state
        call.grant = opened.grant
        return opened.grant, opened.state

    def _fingerprint(self, call: ModelCall, eid: str, conversation: list[Any]) -> Fingerprint:
        """The conversation's digests. When it starts, byte for byte, with the conversation of
        the episode's previous turn in this process, only the new messages are hashed
        (core/prefixes.py), and a check of the body needs to look only at those."""
        earlier = call.raw_from  # (the episode's previous turn, when its Raw proves some)
        now = prefixes.written(conversation, earlier, call.dialect.heads + call.raw_proven
                               if earlier is not None and call.raw_proven else 0)
        if now is None:
            return Fingerprint(conversation)
        call.written = now
        previous = call.extends = prefixes.extended(self.prefixes.get(eid), now)
        return prefixes.fingerprint(previous, conversation, now)

    def _keep_prefix(self, call: ModelCall, eid: str, grant: Grant, conversation: list[Any],
                     upstream: UpstreamConfig) -> None:
        """This turn's conversation, for the episode's next turn (core/prefixes.py), and what
        its kept entry may leave out (`call.logged_after`)."""
        now, prints = call.written, call.prints
        previous = call.extends
        if not (call.lossless or call.exact) and upstream.kind != "litellm":
            # A body sent as the client wrote it is checked for integers past 64 bits only
            # for its log (calls.py `exact_conversation`): what it adds to its previous turn's.
            call.lossy = previous.lossy if previous is not None else False
            if not call.lossy:
                call.lossy = has_lossy_float(
                    conversation[previous.messages:] if previous is not None else conversation)
        if now is None or prints is None:
            return
        if upstream.kind == "litellm":  # (it may change the messages it is given in place)
            call.placed = None
        plain = call.disclosure_text is None  # the upstream gets the conversation as sent
        if previous is not None and previous.turn:
            # The upstream's conversation starts with all of the previous turn's: it is the
            # client's on both turns, or this one started from that one's placed messages.
            placed = call.placed
            if plain and previous.plain:
                call.logged_after = (previous.turn, previous.attempt, previous.messages,
                                     conversation[previous.messages:], previous.lossless)
            elif placed is not None and placed.base:  # (only after a turn read without loss)
                n, after = call.dialect.kept_after(placed)
                call.logged_after = (previous.turn, previous.attempt, n, after, True)
        # (its messages as the upstream gets them, for the next turn to copy their bytes
        # from: a long conversation's; proxy/spliced.py)
        sent = call.sent_body = SentBody() if (
            call.placed is not None and len(now) >= prefixes.TAIL_FROM) else None
        self.prefixes.keep(eid, Prefix(now, len(prints.messages), prefixes.kept_tail(prints, now),
                                       call.lossless, call.placed, grant.turn, grant.attempt,
                                       plain, prints.as_written, call.raw, call.lossy, sent))

    def _new_episode(
        self, call: ModelCall, eid: str, headers: dict[bytes, bytes], now: float,
        drawn: tuple[EpisodeSpec, Assigned] | None,
    ) -> EpisodeState:
        """The state a call's first turn creates its episode with. A new episode that names an
        experiment raises NeedArm until its arm is `drawn`; only the creation of an episode
        reads that header."""
        try:
            if drawn is not None:
                spec, assigned = drawn
            else:
                spec, assigned = spec_from_headers(eid, headers), None
                named = headers.get(EXPERIMENT_HEADER)
                if named:  # a name no experiment has is a 400
                    if self.experiments is None:
                        raise invalid_request("Header X-Episode-Experiment names no "
                                              "configured experiment", "experiment")
                    raise NeedArm(self.experiments.named(named), spec)
            st = new_episode(spec, self.budget_cfg, self.disc_cfg, now)
        except SpecError as e:
            raise invalid_request(str(e), e.param) from None
        st.model = call.model
        if assigned is not None:
            st.experiment, st.arm = assigned.experiment, assigned.arm.name
            st.model = assigned.arm.model or st.model
        return st

    async def _draw(self, need: NeedArm) -> tuple[EpisodeSpec, Assigned]:
        """A new episode's experiment arm (and its spec with the arm), drawn from the store."""
        assert self.experiments is not None
        return await self.experiments.assign(need.experiment, need.spec)

    def _store_down(self, e: StoreUnavailable, now: float) -> None:
        """Count and log a store that did not answer; a 503 unless fail_open forwards."""
        # A store that is only busy (this process's connections all taken) is never read
        # as down: fail_open would forward such calls uncounted.
        fail_open = self.fail_open and not isinstance(e, StoreBusy)
        policy = "fail_open" if fail_open else "fail_closed"
        if self.metrics is not None:
            self.metrics.store_unavailable.labels(policy).inc()
        if now - self._store_down_logged_at >= STORE_DOWN_LOG_EVERY_S:
            # once in a while, not per call: an outage would otherwise flood the log
            self._store_down_logged_at = now
            log.warning("episode store unavailable: model calls are %s (%s)",
                        "forwarded without accounting" if fail_open
                        else "answered 503 store_unavailable", policy)
        if not fail_open:
            raise ProxyError(503, "store_unavailable",
                             "The episode store is unavailable; try again shortly") from None

    async def _created(self, st: EpisodeState, size: int | None) -> None:
        """A new episode: announced to the recorder, and its group declared with its size."""
        key = group_key(st)
        if size is not None and key is not None and self.groups is not None:
            with contextlib.suppress(StoreUnavailable):  # the group API can declare it
                await self.groups.declare(key, size)
        await self.recorder.episode_started(st)

    # -- budget spent ----------------------------------------------------------------------------

    async def _exhausted(
        self, call: ModelCall, st: EpisodeState, send: Send, conversation: list[Any],
        refused: int,
    ) -> None:
        if self.metrics is not None:
            self.metrics.budget_exhausted.labels(tier_label(st.budget, st.max_turns),
                                                 st.disclosure).inc()
        call.outcome = outcome.exhausted(refused)
        if axes.has_axes(st):
            call.cumulative = axes.cumulative(st, time.time())
        try:
            if self.budget_cfg.on_exhausted == "finish":
                await self.final_reply(call, st, send, refused)
            elif st.exhausted_by is not None:
                raise axis_calls.axis_exhausted(st, refused)
            else:
                raise budget_exhausted(local_id(st.episode_id), st.budget, refused)
        finally:  # (what the client was answered: the final reply, or none)
            reply = axis_calls.read_reply(call) if call.outcome.status == "synthetic" else None
            await self.settlement.record_turn(call, conversation, reply, charged=False)

    async def final_reply(
        self, call: ModelCall, st: EpisodeState, send: Send, refused: int
    ) -> None:
        """Finish mode's answer to a call its episode has no budget for: a final assistant
        reply that names the axis that ran out (`budget.finish_texts`), while the episode has
        final replies left (`budget.finish_replies`); past them, episode_finished (an agent
        that keeps asking must end). The reply stays on the call, as an upstream's answer
        does, for its record."""
        limit = self.budget_cfg.finish_replies
        if limit is not None and not await self._finish_reply_left(st.episode_id, limit):
            raise episode_finished(local_id(st.episode_id), refused, limit)
        text = finish_text(self.finish_texts, st, time.time())
        ctype, data = call.dialect.synthetic(call.model or "", self.budget_cfg.finish_reason,
                                             call.stream, call.payload or {}, text)
        call.outcome = outcome.final_reply(call.outcome)
        if call.stream:
            call.events = EventSplitter().feed(data)
        else:
            call.data = data
        call.started = True
        head = self.settlement.episode_headers(call)
        await send_response(send, 200, [(b"content-type", ctype), *head,
                                        (b"x-episode-exhausted", b"true")], data)

    async def _finish_reply_left(self, episode_id: str, limit: int) -> bool:
        try:
            return await self.store.finish_reply(episode_id, limit)
        except StoreUnavailable:  # the reply, uncounted: what finish mode gave before the cap
            log.warning("store unavailable while counting the final replies of %s", episode_id)
            return True
