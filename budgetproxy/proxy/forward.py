"""Model calls' admission (parse, open a turn, rewrite) into a Plan, and its forwarding."""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import logging
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, NamedTuple

import orjson

from budgetproxy.config import Config, UpstreamConfig
from budgetproxy.core import axes, compaction, disclosure, prefixes
from budgetproxy.core.budget import tier_label
from budgetproxy.core.episode import EpisodeState, Grant, GrantKind
from budgetproxy.core.fingerprint import Fingerprint
from budgetproxy.core.finish import finish_text
from budgetproxy.core.forwarded_headers import HeaderPolicy
from budgetproxy.core.keys import KeyRing, Principal
from budgetproxy.core.paths import wire_query
from budgetproxy.core.prefixes import Prefix, Prefixes
from budgetproxy.core.prices import PriceTable
from budgetproxy.core.replays import Replays
from budgetproxy.core.spec import EpisodeSpec, SpecError, new_episode
from budgetproxy.core.tenants import TENANT_HEADER, local_id, qualified, tenant_for, tenant_of
from budgetproxy.errors import (
    ProxyError,
    budget_exhausted,
    checked_episode_id,
    episode_finished,
    invalid_api_key,
    invalid_episode_id,
    invalid_request,
)
from budgetproxy.proxy import axis_calls, capture, outcome
from budgetproxy.proxy.asgi import (
    ClientGone,
    Receive,
    Scope,
    Send,
    read_body,
    send_error,
    send_response,
)
from budgetproxy.proxy.calls import (
    PROBE_HEADER,
    ModelCall,
    turn_hash,
    with_stream_usage,
)
from budgetproxy.proxy.dialects import DIALECTS
from budgetproxy.proxy.dialects.base import lone_text
from budgetproxy.proxy.episode_keys import EpisodeKeys
from budgetproxy.proxy.experiments import EXPERIMENT_HEADER, Assigned, Experiments, NeedArm
from budgetproxy.proxy.grouping import group_key, group_size
from budgetproxy.proxy.refusal import refusal_status
from budgetproxy.proxy.settlement import Settlement
from budgetproxy.proxy.sse import EventSplitter
from budgetproxy.proxy.upstream import UpstreamPool
from budgetproxy.proxy.upstream_call import Leg, UpstreamCall
from budgetproxy.proxy.wire import (
    Checked,
    encode_exact,
    exact_payload,
    ignored_spec_headers,
    parse_payload,
    spec_from_headers,
)
from budgetproxy.store.base import EpisodeStore, StoreBusy, StoreUnavailable, TurnOpen
from budgetproxy.store.groups import GroupStore
from budgetproxy.telemetry.metrics import Metrics
from budgetproxy.telemetry.tracing import Tracing
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
        self.cfg = config
        self.pool = pool
        self.store = store
        self.recorder = recorder
        self.metrics = metrics
        self.tracing = tracing
        self.groups = groups
        self.episode_keys = episode_keys
        self.experiments = experiments
        names = ["x-episode-id", *(h.lower() for h in config.episodes.all_id_headers())]
        self.id_headers = tuple(dict.fromkeys(n.encode() for n in names))
        self.alias_headers = self.id_headers[1:]
        self._store_down_logged_at = float("-inf")
        self.keys = KeyRing.of(config.auth)
        self.uncounted = tuple(config.episodes.uncounted_models)
        self.uncounted_prompts = frozenset(p.strip() for p in config.episodes.uncounted_prompts)
        presets = config.episodes.compaction_marks()
        self.compaction_marks = {kind: compaction.recognisers(presets, kind)
                                 for kind in ("chat", "completions", "responses", "messages")}
        self.compaction_free = config.episodes.compaction == "free"
        # The last choice of earlier texts to re-apply, per recent episode (core/replays.py).
        self.replays = Replays()
        # Each recent episode's last conversation, for its next turn to hash and check only
        # what it adds (core/prefixes.py).
        self.prefixes = Prefixes()
        recorder.forget.append(self.prefixes.drop)  # (an ended episode has no next turn)
        self.budget_cfg = config.budget
        self.disc_cfg = config.disclosure
        self.finish_texts = config.budget.finish_texts.model_dump()
        # whether the disclosure text tells the other axes (its fields change every turn)
        self.tells_axes = any(disclosure.uses_axes(t) for t in (
            config.disclosure.template,
            *(a.template for e in config.experiments for a in e.arms if a.template)))
        self.max_body = config.server.max_body_bytes
        self.fail_open = config.store.on_unavailable == "fail_open"
        self.prices = PriceTable({g: p.model_dump() for g, p in config.prices.items()})
        self.settlement = Settlement(config, store, recorder, metrics, tracing, self.prices)
        self.upstream = UpstreamCall(
            pool, metrics, tracing, litellm_call,
            header_policy=HeaderPolicy(config.server.forward_headers,
                                       (*self.id_headers, PROBE_HEADER)),
            own_keys=self.keys.required)

    # -- entry -------------------------------------------------------------------------------
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

    def _episode_id(self, headers: dict[bytes, bytes], path_episode: str | None) -> str | None:
        """The path prefix, else X-Episode-Id, else the first alias header sent. Only the
        path and X-Episode-Id can disagree (a 400); an alias never overrides either: agents
        send theirs on every call (Claude Code's session id), whatever the harness chose."""
        raw = headers.get(b"x-episode-id")
        primary = None if raw is None else raw.decode("latin-1")
        if path_episode is not None:
            if primary is not None and primary != path_episode:
                raise invalid_episode_id(
                    f"Episode id in the header ({primary!r}) differs from the one in the path "
                    f"({path_episode!r})"
                )
            return checked_episode_id(path_episode)
        if primary is not None:  # an empty id is a bad id, not none: it would go uncounted
            return checked_episode_id(primary)
        for name in self.alias_headers:
            raw = headers.get(name)
            if raw is not None:
                return checked_episode_id(raw.decode("latin-1"))
        return None

    def _one_id_each(self, raw_headers: list[tuple[bytes, bytes]]) -> None:
        """An id header sent twice with different ids names no one episode: a 400, as a header
        and a path that disagree are (never the last line winning silently)."""
        seen: dict[bytes, bytes] = {}
        for name, value in raw_headers:
            if name in self.id_headers and seen.setdefault(name, value) != value:
                raise invalid_episode_id(
                    f"{name.decode('latin-1')} is sent twice with different episode ids "
                    f"({seen[name].decode('latin-1')!r}, {value.decode('latin-1')!r})")

    async def _handle(
        self, call: ModelCall, scope: Scope, receive: Receive, send: Send, path_episode: str | None
    ) -> None:
        """Admission, one step each: the key, the episode id, the body parsed and validated,
        the upstream for its model, whether it is counted, its turn opened and the body
        rewritten (`_take_turn`); the `Plan` it gives is forwarded (`_forward`)."""
        headers: dict[bytes, bytes] = dict(scope["headers"])
        keyed = None if self.episode_keys is None else self.episode_keys.episode_of(
            headers.get(b"authorization"))
        if keyed is not None:
            who, path_episode = self._keyed(keyed, path_episode)
        else:
            found = self.keys.principal(headers.get(b"authorization"),
                                        headers.get(b"x-api-key"))  # (x-api-key: Anthropic's)
            if found is None:
                raise invalid_api_key()
            who = found
        if len(headers) < len(scope["headers"]):  # a header sent twice: the dict kept the last
            self._one_id_each(scope["headers"])
        eid = self._episode_id(headers, path_episode)
        # A probe's call (budgetproxy probe) is never an episode's turn. It may not name one:
        # the marker would otherwise let any agent call past its budget.
        probe = headers.get(PROBE_HEADER)
        if probe is not None and eid is not None:
            raise invalid_request(
                "A probe call (X-Budgetproxy-Probe) names no episode: send it without an "
                "episode id", "X-Budgetproxy-Probe")
        if eid is not None and (who.tenant is not None or who.admin):
            try:  # the store knows it by its tenant's name for it
                eid = qualified(tenant_for(who, headers.get(TENANT_HEADER)), eid)
            except ValueError as e:
                raise invalid_request(str(e), "tenant") from None
        body = await read_body(receive, headers, self.max_body)
        payload, upstream, counted, conversation = self._parse(call, body, eid)
        call.episode_id = eid
        if not counted:
            kept = self._uncounted(call, payload, conversation, probe)
            await self._forward(call, Plan(upstream, headers, body, payload, kept), receive, send)
            return
        plan = await self._take_turn(call, upstream, headers, body, payload, conversation, send)
        if plan is not None:  # (None: answered here, its budget spent)
            await self._forward(call, plan, receive, send)

    @staticmethod
    def _keyed(keyed: str, path_episode: str | None) -> tuple[Principal, str | None]:
        """A per-episode key names its episode (in its tenant's namespace) and stands for the
        key it was minted behind; a path naming another episode is a 400."""
        if path_episode is not None and path_episode != local_id(keyed):
            raise invalid_episode_id(f"The episode key names episode {local_id(keyed)!r}, "
                                     f"the path {path_episode!r}")
        return Principal(tenant=tenant_of(keyed)), local_id(keyed)

    def _parse(
        self, call: ModelCall, body: bytes, eid: str | None
    ) -> tuple[dict[str, Any], UpstreamConfig, bool, list[Any]]:
        """The body parsed once and validated by the route's dialect, the upstream that serves
        its model, and whether the call is an episode's turn (an episode id, required when
        configured, a model not in `uncounted_models`, not an uncounted prompt, not a free
        compaction call), with its conversation when that had to be read to tell."""
        dialect = call.dialect
        payload = parse_payload(body)
        dialect.validate(payload)
        call.payload = payload
        call.model = model = payload["model"]
        call.stream = payload.get("stream") is True
        upstream = self.pool.route(model)
        if upstream is None:
            raise ProxyError(404, "model_not_found", f"No upstream serves model {model!r}",
                             param="model")
        if upstream.kind == "litellm" and not dialect.via_litellm:
            raise ProxyError(400, "unsupported_api", f"Upstream {upstream.name!r} (kind: "
                             f"litellm) serves chat completions only, not {call.route}",
                             param="model")
        if eid is None and self.cfg.episodes.require_id:
            raise ProxyError(
                400, "episode_id_required",
                "This proxy requires an episode id (X-Episode-Id header or /episodes/{id}/v1 "
                "path prefix)", param="episode_id",
            )
        counted = eid is not None and not (
            self.uncounted and any(fnmatch.fnmatchcase(model, p) for p in self.uncounted))
        conversation = dialect.conversation(payload) if counted else []
        if counted and self.uncounted_prompts and (
                lone_text(conversation, dialect.heads) in self.uncounted_prompts):
            counted = False  # a capability probe, not a turn of the task
        marks = self.compaction_marks.get(dialect.kind)
        if counted and marks and compaction.is_compaction(conversation, marks):
            call.compaction = True  # a CLI shortening its history: no step of the task
            counted = not self.compaction_free
        return payload, upstream, counted, conversation

    def _uncounted(
        self, call: ModelCall, payload: dict[str, Any], conversation: list[Any],
        probe: bytes | None,
    ) -> list[Any] | None:
        """A call no episode counts: forwarded as sent; the conversation kept for the record
        of a probe's or a compaction's call (None: no record reads it)."""
        if self.metrics is not None and not call.compaction:
            m = self.metrics
            m.child(m.calls_without_episode, call.route).inc()
        if probe is not None:
            call.probe = probe.decode("latin-1")
        return conversation if call.compaction else (
            None if probe is None else call.dialect.conversation(payload))

    async def _take_turn(
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
        if grant.hold is not None and grant.hold.cap is not None:
            payload = axis_calls.clamped(
                call, self._exact(call, body, payload) or payload, grant.hold.cap)
            conversation, body = call.dialect.conversation(payload), b""
        if st.arm is not None and self.experiments is not None:
            routed = self._arm_upstream(call, st)
            if routed is not None:  # the arm's model instead
                upstream, arm_model = routed
                payload = dict((self._exact(call, body, payload) if body else None) or payload)
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
        payload, call.placed = call.dialect.place(payload, conversation, cfg.placement, text,
                                                  again, previous)
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
        cap = axis_calls.client_cap(call)
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
        now = prefixes.written(conversation)
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
        if now is None or prints is None:
            return
        if upstream.kind == "litellm":  # (it may change the messages it is given in place)
            call.placed = None
        plain = call.disclosure_text is None  # the upstream gets the conversation as sent
        previous = call.extends
        if previous is not None and previous.turn:
            # The upstream's conversation starts with all of the previous turn's: it is the
            # client's on both turns, or this one started from that one's placed messages.
            placed = call.placed
            if plain and previous.plain:
                call.logged_after = (previous.turn, previous.attempt, previous.messages,
                                     conversation[previous.messages:], previous.lossless)
            elif placed is not None and placed.base:  # (only after a turn read without loss)
                call.logged_after = (previous.turn, previous.attempt, placed.base,
                                     placed.messages[placed.base:], True)
        self.prefixes.keep(eid, Prefix(now, len(prints.messages), prefixes.kept_tail(prints, now),
                                       call.lossless, call.placed, grant.turn, grant.attempt,
                                       plain, prints.as_written))

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

    # -- budget spent --------------------------------------------------------------------------
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
                await self._final_reply(call, st, send, refused)
            elif st.exhausted_by is not None:
                raise axis_calls.axis_exhausted(st, refused)
            else:
                raise budget_exhausted(local_id(st.episode_id), st.budget, refused)
        finally:  # (what the client was answered: the final reply, or none)
            reply = axis_calls.read_reply(call) if call.outcome.status == "synthetic" else None
            await self.settlement.record_turn(call, conversation, reply, charged=False)

    async def _final_reply(
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
        exact = self._exact(call, body, payload) if body else None
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
            exact = self._exact(call, body, payload)
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
        await self._final_reply(call, st, send, refused)

    @staticmethod
    def _exact(call: ModelCall, body: bytes, payload: dict[str, Any]) -> dict[str, Any] | None:
        """The payload to rewrite, read again when orjson's reading lost an integer's
        digits (the rewrite must not change what it does not touch); None: `payload` is.
        The messages the previous turn checked are not looked at again (core/prefixes.py)."""
        previous, prints, dialect = call.extends, call.prints, call.dialect
        checked = None
        if previous is not None and previous.lossless and prints is not None:
            checked = Checked(prints.messages, previous.messages, dialect.items_key,
                              dialect.heads)
        exact = exact_payload(body, payload, checked)
        call.exact = exact is not None
        call.lossless = not call.exact
        return exact

    @staticmethod
    def _encode(call: ModelCall, payload: dict[str, Any]) -> bytes:
        """The rewritten body's bytes. What the proxy parsed it can write, except nesting past
        orjson's 254 levels (in a body with no integer past 64 bits, which the standard
        library writes instead): that call is refused, its turn given back, its record kept."""
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

