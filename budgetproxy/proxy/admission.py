"""Who a model call is from, which episode it names, and its body read and routed: the first
steps of its admission, and whether it is an episode's turn at all (forward.py `_handle`)."""

from __future__ import annotations

import fnmatch
from typing import Any, NamedTuple

from budgetproxy.config import Config, UpstreamConfig
from budgetproxy.core import compaction
from budgetproxy.core.keys import KeyRing, Principal
from budgetproxy.core.prefixes import Prefixes
from budgetproxy.core.tenants import TENANT_HEADER, local_id, qualified, tenant_for, tenant_of
from budgetproxy.errors import (
    ProxyError,
    checked_episode_id,
    invalid_api_key,
    invalid_episode_id,
    invalid_request,
)
from budgetproxy.proxy.asgi import Scope
from budgetproxy.proxy.calls import PROBE_HEADER, ModelCall
from budgetproxy.proxy.dialects.base import lone_text
from budgetproxy.proxy.episode_keys import EpisodeKeys
from budgetproxy.proxy.upstream import UpstreamPool
from budgetproxy.proxy.wire import parse_payload
from budgetproxy.telemetry.metrics import Metrics


class Caller(NamedTuple):
    """Who sent a call, as its head says: its headers, the episode it names (None: none, in
    its tenant's namespace) and its probe marker (budgetproxy probe)."""

    headers: dict[bytes, bytes]
    episode_id: str | None
    probe: bytes | None


class Admission:
    """A model call's key, episode id and body, each checked, with a clear error for each."""

    def __init__(self, config: Config, pool: UpstreamPool, metrics: Metrics | None,
                 episode_keys: EpisodeKeys | None, prefixes: Prefixes) -> None:
        self.cfg = config
        # each recent episode's last turn: a counted call reads its conversation on from it
        self.prefixes = prefixes
        self.pool = pool
        self.metrics = metrics
        self.episode_keys = episode_keys
        names = ["x-episode-id", *(h.lower() for h in config.episodes.all_id_headers())]
        self.id_headers = tuple(dict.fromkeys(n.encode() for n in names))
        self.alias_headers = self.id_headers[1:]
        self.keys = KeyRing.of(config.auth)
        self.uncounted_models = tuple(config.episodes.uncounted_models)
        self.uncounted_prompts = frozenset(p.strip() for p in config.episodes.uncounted_prompts)
        presets = config.episodes.compaction_marks()
        self.compaction_marks = {kind: compaction.recognisers(presets, kind)
                                 for kind in ("chat", "completions", "responses", "messages")}
        self.compaction_free = config.episodes.compaction == "free"

    def caller(self, scope: Scope, path_episode: str | None) -> Caller:
        """The call's key checked (or its per-episode key read), and the episode it names: the
        path prefix, X-Episode-Id or an alias header, qualified by its tenant."""
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
        return Caller(headers, eid, probe)

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

    @staticmethod
    def _keyed(keyed: str, path_episode: str | None) -> tuple[Principal, str | None]:
        """A per-episode key names its episode (in its tenant's namespace) and stands for the
        key it was minted behind; a path naming another episode is a 400."""
        if path_episode is not None and path_episode != local_id(keyed):
            raise invalid_episode_id(f"The episode key names episode {local_id(keyed)!r}, "
                                     f"the path {path_episode!r}")
        return Principal(tenant=tenant_of(keyed)), local_id(keyed)

    def parse(
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
            self.uncounted_models
            and any(fnmatch.fnmatchcase(model, p) for p in self.uncounted_models))
        conversation: list[Any] = []
        if counted:
            assert eid is not None
            call.raw_from = earlier = self.prefixes.get(eid)
            conversation, call.raw, call.raw_proven, call.floatless = dialect.conversation_from(
                payload, None if earlier is None else earlier.raw)
        if counted and self.uncounted_prompts and (
                lone_text(conversation, dialect.heads) in self.uncounted_prompts):
            counted = False  # a capability probe, not a turn of the task
        marks = self.compaction_marks.get(dialect.kind)
        if counted and marks and compaction.is_compaction(conversation, marks):
            call.compaction = True  # a CLI shortening its history: no step of the task
            counted = not self.compaction_free
        return payload, upstream, counted, conversation

    def uncounted(
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
