"""The ASGI application: a thin dispatcher, the model-call hot path, and the lifespan."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from opentelemetry.sdk.trace import SpanProcessor
from prometheus_client import CollectorRegistry
from starlette.exceptions import HTTPException as StarletteHTTPException

from budgetproxy.config import ENV_MULTIPROC_DIR, Config
from budgetproxy.core.ids import split_episode_prefix
from budgetproxy.core.keys import KeyRing
from budgetproxy.core.paths import wire_path
from budgetproxy.errors import (
    ProxyError,
    invalid_api_key,
    request_too_large,
)
from budgetproxy.proxy.asgi import Receive, Scope, Send, send_error
from budgetproxy.proxy.episode_keys import EpisodeKeys
from budgetproxy.proxy.experiments import Experiments
from budgetproxy.proxy.forward import ModelCalls
from budgetproxy.proxy.grouping import RolloutRecorder, with_rollout_group
from budgetproxy.proxy.upstream import UpstreamPool
from budgetproxy.serve.allocator import heap_reader
from budgetproxy.serve.episode_api import build_api
from budgetproxy.serve.experiments_api import add_experiment_routes
from budgetproxy.serve.groups_api import add_group_routes
from budgetproxy.serve.paths import destination
from budgetproxy.serve.trajectory_api import add_trajectory_route
from budgetproxy.store.base import EpisodeStore, StoreUnavailable
from budgetproxy.store.experiments import (
    ExperimentStore,
    MemoryExperiments,
    RedisExperiments,
)
from budgetproxy.store.groups import GroupStore, MemoryGroups, RedisGroups
from budgetproxy.store.turn_log import MemoryTurnLog, RedisTurnLog, TurnLog
from budgetproxy.telemetry.metrics import Metrics
from budgetproxy.telemetry.tracing import Tracing, build_processor, tracing_wanted
from budgetproxy.trajectories.sink import JsonlSink, NullSink, TrajectorySink

log = logging.getLogger("budgetproxy")
METRICS_FLUSH_S = 1.0


def _make_store(config: Config) -> EpisodeStore:
    if config.store.kind == "redis":
        from budgetproxy.store.redis import RedisStore

        ep = config.episodes
        store: EpisodeStore = RedisStore(config.store.url, prefix=config.store.key_prefix,
                                         idle_timeout_s=ep.idle_timeout_s,
                                         retention_s=ep.retention_s,
                                         sweep_interval_s=ep.sweep_interval_s,
                                         cluster=config.store.cluster,
                                         max_connections=config.store.max_connections)
        return store
    from budgetproxy.store.memory import MemoryStore

    return MemoryStore(max_retained=config.episodes.max_retained)


def _make_groups(config: Config) -> GroupStore:
    if config.store.kind == "redis":
        return RedisGroups(config.store.url, config.store.key_prefix,
                           config.episodes.retention_s, config.store.max_connections)
    return MemoryGroups()


def _make_experiments(config: Config) -> ExperimentStore:
    if config.store.kind == "redis" and config.experiments:
        return RedisExperiments(config.store.url, config.store.key_prefix)
    return MemoryExperiments()


def full_budgets(config: Config) -> dict[str, float]:
    """`budget.budgetmix.max_*` of the axes beside turns, as episode record fields, when the
    BudgetMix sampler draws over them."""
    if config.budget.sampler != "budgetmix":
        return {}
    bm = config.budget.budgetmix
    return {name: value for name, value in (
        ("full_token_budget", bm.max_tokens), ("full_cost_budget", bm.max_cost_usd),
        ("full_time_budget_s", bm.max_time_s)) if value is not None}


def _make_turn_log(config: Config, store: EpisodeStore) -> TurnLog | None:
    if not config.rollouts.keep_turns:
        return None
    retention = config.episodes.retention_s + config.episodes.idle_timeout_s
    if config.store.kind == "redis":
        from budgetproxy.store.redis import RedisStore

        assert isinstance(store, RedisStore)  # _make_store's: the turns share its connections
        return RedisTurnLog(store, retention)
    return MemoryTurnLog(retention, max_bytes=config.rollouts.max_bytes)


def _metrics_registries(turn_buckets: int) -> tuple[Metrics, CollectorRegistry]:
    """The metric families and the registry /metrics exposes."""
    if not os.environ.get(ENV_MULTIPROC_DIR):
        exposed = CollectorRegistry(auto_describe=True)
        return Metrics(exposed, turn_buckets), exposed
    from prometheus_client import multiprocess

    # Families are still defined on a per-process registry; the exposition merges the files
    # every worker writes, after this worker has flushed its deferred updates into its own.
    metrics = Metrics(CollectorRegistry(), turn_buckets)
    exposed = CollectorRegistry()
    exposed.register(metrics.flusher())
    multiprocess.MultiProcessCollector(exposed)  # type: ignore[no-untyped-call]
    return metrics, exposed


class BudgetProxy:
    """Model calls go straight to the hot path; everything else to the FastAPI app."""

    def __init__(
        self,
        config: Config,
        *,
        store: EpisodeStore | None = None,
        sink: TrajectorySink | None = None,
        registry: CollectorRegistry | None = None,
        span_processor: SpanProcessor | None = None,
    ) -> None:
        self.config = config
        self.store = store if store is not None else _make_store(config)
        self._evicted_seen = 0  # evictions already counted in the metric (the sweep adds more)
        if sink is None:
            t = config.trajectories
            sink = (
                JsonlSink(t.dir, max_file_bytes=t.max_file_bytes, gzip_rotated=t.gzip_rotated,
                          queue_size=t.queue_size, linger_s=t.flush_interval_s)
                if t.enabled else NullSink()
            )
        self.sink = sink
        self.metrics: Metrics | None = None
        self.registry: CollectorRegistry | None = None
        if config.metrics.enabled:
            if registry is None:
                self.metrics, self.registry = _metrics_registries(config.metrics.turn_buckets)
            else:
                self.metrics = Metrics(registry, config.metrics.turn_buckets)
                self.registry = registry
            if config.auth.tenants and self.metrics is not None:
                self.metrics.enable_tenants(config.auth.tenants)
        self._heap = heap_reader() if self.metrics is not None else None  # (the sweep reads it)
        # A processor passed in belongs to the caller; one built here is shut down here.
        self._own_processor = span_processor is None and tracing_wanted(config.tracing)
        if self._own_processor:
            span_processor = build_processor(
                self.metrics.count_spans if self.metrics is not None else None)
            if self.metrics is not None and span_processor is not None:
                self.metrics.touch_trace_labels()
        self.tracing = Tracing(span_processor, capture_content=config.tracing.capture_content)
        self.pool = UpstreamPool(config.upstreams, on_desync=self._upstream_desynced)
        if self.metrics is not None:
            for u in config.upstreams:
                self.metrics.touch_upstream_labels(u.name)
        self.groups = _make_groups(config)
        self.turn_log = _make_turn_log(config, self.store)
        self.recorder = RolloutRecorder(self.sink, self.metrics,
                                        config.trajectories.content == "full", self.groups,
                                        self.turn_log)
        self.recorder.full_budgets = full_budgets(config)
        self.experiment_store = _make_experiments(config)
        self.experiments = Experiments(config, self.experiment_store, self.sink, self.metrics)
        if config.experiments:
            self.recorder.experiments = self.experiments
        litellm_call = None
        if any(u.kind == "litellm" for u in config.upstreams):
            from budgetproxy.proxy.litellm_adapter import call_litellm

            litellm_call = call_litellm
        secret = config.rollouts.key_secret
        self.episode_keys = EpisodeKeys(secret.encode() if secret else os.urandom(32))
        self.calls = ModelCalls(config, self.pool, self.store, self.recorder, self.metrics,
                                self.tracing, litellm_call, groups=self.groups,
                                episode_keys=self.episode_keys, experiments=self.experiments)
        self.api = build_api(config, self.store, self.recorder, self.pool, self.registry,
                             self.metrics, extra_routes=self._extra_routes,
                             mint_key=self.episode_keys.mint,
                             experiments=self.experiments)
        self._keys = KeyRing.of(config.auth)
        self._sweeper: asyncio.Task[None] | None = None
        self._flusher: asyncio.Task[None] | None = None

    def _upstream_desynced(self, upstream: str) -> None:
        if self.metrics is not None:
            self.metrics.upstream_errors.labels(upstream, "desync").inc()

    def _extra_routes(self, app: FastAPI) -> None:
        """The rollout gateway's routes, registered before the pass-through ones."""
        add_group_routes(app, self.config, self.store, self.groups)
        add_trajectory_route(app, self.config, self.store, self.turn_log)
        add_experiment_routes(app, self.experiments)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            if scope["type"] == "lifespan":
                await self._lifespan(receive, send)
            else:
                await self.api(scope, receive, send)
            return
        said = scope.get("path", "")  # the path whose API shapes a 503 at shutdown
        try:
            to = destination(scope)
            if to.route is not None:
                said = to.route
                if to.rollout is not None:
                    scope = with_rollout_group(scope, to.rollout)
                await self.calls.handle(scope, receive, send, to.route, to.path_episode)
                return
            if to.refused is not None:
                await send_error(send, to.refused, None, _shape(to.path or scope["path"]))
                return
            if to.path is not None:
                # Everything after this point, the API's routes included, sees one spelling.
                scope = {**scope, "path": to.path, "raw_path": wire_path(to.path).encode()}
                said = to.path
            await self._timed_api(scope, receive, send)
        except asyncio.CancelledError:
            # The server gave up waiting for this request at shutdown (a stalled upload, a call
            # past server.shutdown_timeout_s): an OpenAI-shaped 503, which SDKs retry elsewhere,
            # instead of the server's plain-text 500.
            if not await _answer_cancelled(send, said):
                raise

    async def _timed_api(self, scope: Scope, receive: Receive, send: Send) -> None:
        t0 = time.perf_counter()
        status = 500
        headers = dict(scope["headers"])
        who = self._keys.principal(headers.get(b"authorization"), headers.get(b"x-api-key"))
        if who is not None:  # the episode API reads it, for the key's tenant
            scope.setdefault("state", {})["principal"] = who
        elif scope["path"].startswith("/v1"):
            # Every /v1 route the API serves needs the key; checked here, before FastAPI,
            # which would judge a body (as JSON) before any route dependency ran.
            await send_error(send, invalid_api_key(), None, _shape(scope["path"]))
            return
        if scope["method"] in ("POST", "PUT", "PATCH"):
            # The episode API and pass-through routes take no more than model calls do.
            limit = self.config.server.max_body_bytes
            declared = headers.get(b"content-length", b"0")
            if declared.isdigit() and int(declared) > limit:
                await send_error(send, request_too_large(limit), None, _shape(scope["path"]))
                return
            receive = _limited(receive, limit)

        async def send_status(message: Any) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.api(scope, receive, send_status)
        finally:
            if self.metrics is not None:
                route = scope.get("route")
                template = getattr(route, "path", None) or "other"
                self.metrics.request_duration.labels(template).observe(time.perf_counter() - t0)
                self.metrics.requests.labels(template, str(status)).inc()

    # -- lifespan ------------------------------------------------------------------------------
    async def startup(self) -> None:
        await self.pool.start()
        await self.sink.start()
        await self.experiments.write_settings()
        self._sweeper = asyncio.create_task(self._sweep(), name="episode-sweeper")
        if self.metrics is not None:
            self._flusher = asyncio.create_task(self._flush_metrics(), name="metrics-flush")

    async def shutdown(self) -> None:
        for task in (self._sweeper, self._flusher):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        try:
            for st in await self.store.finish_all_active(time.time()):
                await self.recorder.episode_ended(st)
        except StoreUnavailable:
            log.warning("store unavailable at shutdown; active episodes were not ended")
        await self.sink.close()
        await self.pool.close()
        await self.store.close()
        await self.groups.close()
        await self.experiment_store.close()
        if self.turn_log is not None:
            await self.turn_log.close()
        if self.metrics is not None:
            self.metrics.flush()
        if self._own_processor:
            # Off the event loop: a last export may wait on the collector for a few seconds.
            await asyncio.to_thread(self.tracing.shutdown)

    async def _flush_metrics(self) -> None:
        """Deferred metric updates reach prometheus-client at least once a second (scrapes
        flush too; this is for the other workers' scrapes in multiprocess mode)."""
        assert self.metrics is not None
        while True:
            await asyncio.sleep(METRICS_FLUSH_S)
            self.metrics.flush()

    async def _sweep(self) -> None:
        ep = self.config.episodes
        while True:
            await asyncio.sleep(ep.sweep_interval_s)
            if self._heap is not None and self.metrics is not None:  # (whatever the store does)
                in_use, free = self._heap()
                self.metrics.heap_bytes.labels("in_use").set(in_use)
                self.metrics.heap_bytes.labels("free").set(free)
            try:
                ended = await self.store.expire_idle(time.time(), ep.idle_timeout_s,
                                                     ep.retention_s)
                for st in ended:
                    await self.recorder.episode_ended(st)
                await self.experiments.review()
                if self.metrics is not None:
                    self.metrics.queue_depth.set(self.sink.depth())
                    self.metrics.store_degraded.set(0)
                    evicted = getattr(self.store, "evicted", None)  # the memory store's count
                    if isinstance(evicted, int) and evicted > self._evicted_seen:
                        self.metrics.retained_evictions.inc(evicted - self._evicted_seen)
                        self._evicted_seen = evicted
            except StoreUnavailable:
                if self.metrics is not None and self.config.store.on_unavailable == "fail_open":
                    self.metrics.store_degraded.set(1)
                continue
            except Exception:
                log.exception("episode sweep failed")

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.startup()
                except Exception as e:
                    log.exception("startup failed")
                    await send({"type": "lifespan.startup.failed", "message": str(e)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                try:
                    await self.shutdown()
                finally:
                    await send({"type": "lifespan.shutdown.complete"})
                return


def create_app(config: Config, **kwargs: Any) -> BudgetProxy:
    """Build the proxy for `config`; nothing starts until the server runs its lifespan."""
    return BudgetProxy(config, **kwargs)


def _shape(path: str) -> Callable[[ProxyError], bytes] | None:
    """How an error on `path` is written: Anthropic's shape on the Messages API's routes."""
    return ProxyError.anthropic_body if path.startswith("/v1/messages") else None


async def _answer_cancelled(send: Send, path: str) -> bool:
    """Answer a request cancelled before its response began; False if it had begun."""
    try:
        await send_error(send, ProxyError(
            503, "shutting_down", "The proxy is shutting down; retry the request"), None,
            _shape(split[1] if (split := split_episode_prefix(path)) else path))
    except Exception:  # the response had started: the server closes the connection
        return False
    return True


def _limited(receive: Receive, limit: int) -> Receive:
    """`receive`, refusing a body that grows past `limit` bytes (chunked uploads say no size
    up front): the route's error handler answers 413."""
    seen = 0

    async def limited() -> Any:
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > limit:
                raise StarletteHTTPException(413, request_too_large(limit).message)
        return message

    return limited
