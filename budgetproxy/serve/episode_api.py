"""The episode API, health, metrics, model list and pass-through routes (FastAPI)."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

import aiohttp
import orjson
from fastapi import Body, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from budgetproxy.config import Config
from budgetproxy.core import axes
from budgetproxy.core.budget import tier_label
from budgetproxy.core.episode import EpisodeState, FinishStatus, OutcomeReport
from budgetproxy.core.forwarded_headers import HeaderPolicy
from budgetproxy.core.keys import OPEN
from budgetproxy.core.paths import wire_query
from budgetproxy.core.spec import (
    EpisodeSpec,
    SpecError,
    new_episode,
)
from budgetproxy.core.tenants import local_id, qualified, tenant_for, tenant_of
from budgetproxy.errors import ProxyError, checked_episode_id, request_too_large, upstream_redirect
from budgetproxy.proxy.experiments import Experiments
from budgetproxy.proxy.upstream import UpstreamPool
from budgetproxy.serve.episode_bodies import EpisodeCreate, OutcomeBody
from budgetproxy.serve.openapi import install as install_openapi
from budgetproxy.store.base import EpisodeStore, StoreUnavailable
from budgetproxy.telemetry.metrics import Metrics
from budgetproxy.trajectories.recorder import Recorder

log = logging.getLogger("budgetproxy")


def episode_view(st: EpisodeState) -> dict[str, Any]:
    view = {
        "episode_id": local_id(st.episode_id),
        "task_id": st.task_id,
        "group": st.group,
        "budget": st.budget,
        "max_turns": st.max_turns,
        "tier": tier_label(st.budget, st.max_turns),
        "disclosure": st.disclosure,
        "announced_budget": st.announced_budget,
        "min_turns": st.min_turns,
        "turns_used": st.turns_used,
        "remaining": st.remaining,
        "status": st.status,
        "outcome": st.outcome,
        "success_turn": st.settled_success_turn,
        "reward": st.reward,
        "exhausted": st.exhausted,
        "end_reason": st.end_reason,
        # Ended while turns were in flight: until they settle (and may be refunded), the
        # numbers and end reason above are provisional, and the episode is not yet logged.
        "settling": st.end_pending,
        "tags": st.tags,
        **axes.view(st, time.time()),
    }
    if st.experiment is not None:
        view["experiment"], view["arm"] = st.experiment, st.arm
    tenant = tenant_of(st.episode_id)
    if tenant is not None:
        view["tenant"] = tenant
    return view


def stored_id(request: Request, episode_id: str) -> str:
    """The id the store knows the episode `episode_id` names by, in the namespace of the
    request's key (the app puts who the key is in the request's state)."""
    who = getattr(request.state, "principal", OPEN)
    try:
        tenant = tenant_for(who, request.headers.get("x-episode-tenant", "").encode() or None)
    except ValueError as e:
        raise ProxyError(400, "invalid_request", str(e), param="tenant") from None
    return qualified(tenant, checked_episode_id(episode_id))


def _json(data: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json")


def _error(err: ProxyError, path: str = "") -> Response:
    """An error the proxy answers; on the Messages API's routes in Anthropic's shape."""
    body = err.anthropic_body() if path.startswith("/v1/messages") else err.body()
    return Response(body, status_code=err.status,
                    headers=dict((k.decode(), v.decode()) for k, v in err.header_list()))


def _not_found(episode_id: str) -> ProxyError:
    return ProxyError(404, "episode_not_found", f"No episode with id {episode_id!r}",
                      param="episode_id")


_OWN_PREFIXES = ("episodes", "groups")  # the proxy's own APIs under /v1: never sent upstream


def _own_route_methods(path: str) -> str | None:
    """The method the proxy's own route matching `path` (under /v1/) takes, or None: the
    episode API, the trajectory route and the group API."""
    parts = path.split("/")
    if parts[0] == "groups":
        if parts == ["groups"]:
            return "POST"
        return "GET" if len(parts) == 3 and all(parts[1:]) else None
    if parts == ["episodes"]:
        return "POST"
    if len(parts) == 2 and parts[1]:
        return "GET"
    if len(parts) == 3 and parts[1] and parts[2] in ("outcome", "end"):
        return "POST"
    if len(parts) == 3 and parts[1] and parts[2] == "trajectory":
        return "GET"
    return None


def build_api(
    config: Config,
    store: EpisodeStore,
    recorder: Recorder,
    pool: UpstreamPool,
    registry: CollectorRegistry | None,
    families: Metrics | None = None,
    extra_routes: Callable[[FastAPI], None] | None = None,
    mint_key: Callable[[str], str] | None = None,
    experiments: Experiments | None = None,
) -> FastAPI:
    """The episode API, /v1/models, pass-through routes and the service endpoints. API keys
    (`auth.keys`) are checked by the app before any /v1 route here (app.py)."""
    forwarded = HeaderPolicy(config.server.forward_headers,
                             (h.lower().encode() for h in config.episodes.id_headers)).forwarded
    # What a call past the budget gets, for harnesses that stop their agent before it makes a
    # call the proxy would refuse (the inspect-ai integration): the same for every episode.
    at_exhaustion = {"on_exhausted": config.budget.on_exhausted,
                     "finish_replies": config.budget.finish_replies}
    app = FastAPI(
        title="budgetproxy",
        summary="Turn budgets per agent episode, in front of any OpenAI-compatible model.",
        docs_url="/docs",
        openapi_url="/openapi.json",
        # No redirects: a 307 to "/v1/" built from a rewritten /episodes/{id}/v1 path lost the
        # id, and API clients do not expect to be sent elsewhere for a slash.
        redirect_slashes=False,
    )

    install_openapi(app)

    @app.exception_handler(ProxyError)
    async def _proxy_error(request: Request, exc: ProxyError) -> Response:
        return _error(exc, request.url.path)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> Response:
        first = exc.errors()[0] if exc.errors() else {}
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]
        param = ".".join(loc) or None
        if first.get("type") == "json_invalid":
            msg = "Request body is not valid JSON"
            param = None
        elif first.get("type") == "extra_forbidden":
            msg = f"Unknown field {param!r}"
        else:
            msg = f"{param or 'body'}: {first.get('msg', 'invalid value')}"
        return _error(ProxyError(400, "invalid_request", msg, param=param))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        # Unknown routes and methods are the proxy's own errors too: OpenAI-shaped.
        code = {404: "not_found", 405: "method_not_allowed",
                413: "request_too_large"}.get(exc.status_code, "http_error")
        message = str(exc.detail)
        if exc.status_code == 404 and message == "Not Found":
            message = f"No route {request.method} {request.url.path}"
        return _error(ProxyError(exc.status_code, code, message,
                                 headers=dict(exc.headers or {})), request.url.path)

    @app.exception_handler(StoreUnavailable)
    async def _store_down(_: Request, exc: StoreUnavailable) -> Response:
        return _error(ProxyError(503, "store_unavailable", "The episode store is unavailable"))

    async def end_and_record(sid: str, report: OutcomeReport | None) -> Response:
        done = await store.finish(sid, report, time.time())
        episode_id = local_id(sid)
        if done.status is None or done.state is None:
            if not await store.is_known(sid):
                raise _not_found(episode_id)
            if report is not None:  # (only its id is left: the report would be lost unseen)
                raise ProxyError(
                    409, "episode_forgotten",
                    f"Episode {episode_id!r} ended and was forgotten (past "
                    "episodes.retention_s, or evicted by episodes.max_retained): its outcome "
                    "can no longer be recorded")
            return _json({"episode_id": episode_id, "status": "finished"})
        if done.status is FinishStatus.CONFLICT:
            raise ProxyError(
                409, "outcome_conflict",
                f"Episode {episode_id!r} already ended ({done.state.end_reason}, "
                + (f"outcome {done.state.outcome}" if done.state.outcome else "no outcome")
                + "); a different report is refused",
            )
        if done.status is FinishStatus.FINISHED and not done.state.end_pending:
            # (with turns in flight, the last of them to settle records it: see forward)
            await recorder.episode_ended(done.state)
        return _json(episode_view(done.state))

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> Response:
        return _json({"status": "ok"})

    @app.get("/readyz", include_in_schema=False)
    async def readyz() -> Response:
        try:
            ok = await asyncio.wait_for(store.ping(), 2.0)
        except (TimeoutError, StoreUnavailable, OSError):
            ok = False
        fail_open = config.store.on_unavailable == "fail_open"
        if families is not None:
            families.store_degraded.set(1 if fail_open and not ok else 0)
        if not ok and fail_open:
            # Still serving (uncounted): a load balancer must keep routing here, which is
            # what fail_open asked for; the body and the metric say what is missing.
            return _json({"status": "degraded", "store": config.store.kind,
                          "detail": "the episode store is unavailable; model calls are "
                                    "forwarded without accounting (store.on_unavailable: "
                                    "fail_open)"})
        if not ok:
            return _json({"status": "unavailable", "store": config.store.kind}, 503)
        return _json({"status": "ready", "store": config.store.kind})

    @app.get("/metrics", include_in_schema=False)
    async def metrics() -> Response:
        if registry is None:
            return Response("metrics are disabled\n", status_code=404)
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.post("/v1/episodes", status_code=201)
    async def create_episode(
        request: Request, body: EpisodeCreate | None = Body(None)  # noqa: B008
    ) -> Response:
        if body is None:
            if (await request.body()).strip():
                raise ProxyError(400, "invalid_request", "Request body must be a JSON object")
            body = EpisodeCreate()  # no body at all: every field is optional
        # An empty id is a bad id (as in the header), not a request for a generated one.
        eid = checked_episode_id(
            f"ep-{uuid.uuid4().hex}" if body.episode_id is None else body.episode_id)
        spec = EpisodeSpec(
            episode_id=stored_id(request, eid), budget=body.budget, max_turns=body.max_turns,
            task_id=body.task_id,
            group=body.group, disclosure=body.disclosure,
            announced_budget=body.announced_budget, tags=body.tags, min_turns=body.min_turns,
            token_budget=body.token_budget, cost_budget=body.cost_budget,
            time_budget_s=body.time_budget_s, announced_tokens=body.announced_tokens,
            announced_cost=body.announced_cost, announced_time_s=body.announced_time_s,
        )
        assigned = None
        if body.experiment is not None:  # the arm, drawn as for a first call's header
            if experiments is None:
                raise ProxyError(400, "invalid_request", "experiment names no configured "
                                 f"experiment: {body.experiment!r}", param="experiment")
            exp = experiments.named(body.experiment, "experiment")
            spec, assigned = await experiments.assign(exp, spec)
        try:
            st = new_episode(spec, config.budget, config.disclosure, time.time())
        except SpecError as e:
            raise ProxyError(400, "invalid_request", str(e), param=e.param) from None
        if assigned is not None:
            st.experiment, st.arm = assigned.experiment, assigned.arm.name
            st.model = assigned.arm.model
        if not await store.create(st):
            raise ProxyError(409, "episode_exists", f"Episode {eid!r} already exists",
                             param="episode_id")
        await recorder.episode_started(st)
        base = str(request.base_url).rstrip("/")
        # The contract's fields, with the rest of what GET answers: one shape for both.
        created = {**episode_view(st), **at_exhaustion, "base_url": f"{base}/episodes/{eid}/v1"}
        if mint_key is not None:  # a bearer key that names this episode: no other id needed
            created["api_key"] = mint_key(st.episode_id)
        return _json(created, 201)

    @app.get("/v1/episodes/{episode_id}")
    async def get_episode(request: Request, episode_id: str) -> Response:
        sid = stored_id(request, episode_id)
        st = await store.get(sid)
        if st is None:
            if await store.is_known(sid):
                return _json({"episode_id": episode_id, "status": "finished"})
            raise _not_found(episode_id)
        return _json({**episode_view(st), **at_exhaustion})

    @app.post("/v1/episodes/{episode_id}/outcome")
    async def report_outcome(
        request: Request, episode_id: str, body: OutcomeBody = Body()  # noqa: B008
    ) -> Response:
        sid = stored_id(request, episode_id)
        if body.success_turn is not None:
            st = await store.get(sid)
            if st is not None and st.status == "active" and body.success_turn > st.turns_used:
                raise ProxyError(
                    400, "invalid_request",
                    f"success_turn {body.success_turn} is past the {st.turns_used} turn(s) "
                    "this episode has used", param="success_turn",
                )
        report = OutcomeReport(success=body.success, reward=body.reward,
                               success_turn=body.success_turn, metadata=body.metadata)
        return await end_and_record(sid, report)

    @app.post("/v1/episodes/{episode_id}/end")
    async def end_episode(request: Request, episode_id: str) -> Response:
        return await end_and_record(stored_id(request, episode_id), None)

    @app.get("/v1/models")
    async def list_models(request: Request) -> Response:
        merged: dict[str, dict[str, Any]] = {}
        query = wire_query(request.scope["query_string"])

        async def fetch(u: Any) -> list[dict[str, Any]] | None:
            if u.kind != "openai":
                return [{"id": m, "object": "model", "owned_by": u.name} for m in u.models
                        if "*" not in m]
            headers = {"authorization": f"Bearer {u.api_key}"} if u.api_key else {}
            try:
                async with pool.session.get(pool.url(u, "/v1/models", query), headers=headers,
                                            timeout=aiohttp.ClientTimeout(total=10),
                                            allow_redirects=False) as r:
                    if r.status != 200:
                        log.warning("upstream %s answered %d to GET /models", u.name, r.status)
                        return None
                    data = orjson.loads(await r.read()).get("data", [])
                    return [m for m in data if isinstance(m, dict) and "id" in m]
            except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError, AttributeError):
                log.warning("could not list models of upstream %s", u.name)
                return None

        answers = await asyncio.gather(*(fetch(u) for u in pool.upstreams))
        if answers and all(a is None for a in answers):
            raise ProxyError(502, "upstream_unreachable",
                             "No upstream answered GET /models")
        for models in answers:
            for m in models or ():
                merged.setdefault(m["id"], m)
        return _json({"object": "list", "data": list(merged.values())})

    if extra_routes is not None:  # before the pass-through routes, which match any path
        extra_routes(app)

    @app.api_route("/v1/{path:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"],
                   include_in_schema=False)
    async def passthrough(request: Request, path: str) -> Response:
        if path.split("/", 1)[0] in _OWN_PREFIXES:
            # The episode and group APIs are the proxy's own: a wrong method or an unknown
            # sub-route is answered here, never sent upstream.
            allowed = _own_route_methods(path)
            if allowed is None:
                raise ProxyError(404, "not_found", f"No route /v1/{path}")
            raise ProxyError(405, "method_not_allowed",
                             f"/v1/{path} takes {allowed}, not {request.method}",
                             headers={"allow": allowed})
        body = await request.body()
        if len(body) > config.server.max_body_bytes:
            raise request_too_large(config.server.max_body_bytes)
        model = None
        if body and request.headers.get("content-type", "").startswith("application/json"):
            try:
                parsed = orjson.loads(body)
                model = parsed.get("model") if isinstance(parsed, dict) else None
            except orjson.JSONDecodeError:
                model = None
        upstream = pool.route(model if isinstance(model, str) else None) or (
            pool.upstreams[0] if pool.upstreams else None)
        if upstream is None or upstream.kind != "openai":
            raise ProxyError(404, "not_found", f"No upstream serves /v1/{path}")
        headers = {k.decode("latin-1"): v.decode("latin-1")
                   for k, v in request.scope["headers"] if forwarded(k)}
        if "content-type" in request.headers:
            headers["content-type"] = request.headers["content-type"]
        anthropic = path.startswith("messages")  # /v1/messages/count_tokens and the like
        if upstream.api_key and anthropic:
            headers["x-api-key"] = upstream.api_key
        elif upstream.api_key:
            headers["authorization"] = f"Bearer {upstream.api_key}"
        elif not config.auth.required:
            for name in ("authorization", "x-api-key"):
                if name in request.headers and not request.headers[name].startswith(
                        "Bearer bpk."):  # an episode key is the proxy's own
                    headers[name] = request.headers[name]
        # the dispatcher made the path canonical (core.paths): it is sent as it was routed
        url = pool.url(upstream, request.scope["path"], wire_query(request.scope["query_string"]))
        try:
            async with pool.session.request(request.method, url, data=body, headers=headers,
                                            timeout=pool.timeout(upstream),
                                            allow_redirects=False) as r:
                if 300 <= r.status < 400:
                    raise upstream_redirect(upstream.name, r.status)
                data = await r.read()
                out = {k: v for k, v in r.headers.items()
                       if k.lower() not in ("content-length", "content-encoding",
                                            "transfer-encoding", "connection", "date", "server")}
                return Response(data, status_code=r.status, headers=out)
        except TimeoutError:
            raise ProxyError(504, "upstream_timeout",
                             f"Upstream {upstream.name!r} timed out") from None
        except aiohttp.ClientError as e:
            raise ProxyError(502, "upstream_unreachable",
                             f"Upstream {upstream.name!r} is unreachable: {e}") from None

    return app
