"""A request's path as the dispatcher routes it: canonical, refused when it has no one
meaning, and the model route it names whatever its spelling."""

from __future__ import annotations

import re
from typing import NamedTuple
from urllib.parse import quote

from budgetproxy.core.ids import is_valid_episode_id, split_episode_prefix
from budgetproxy.core.paths import PathRefused, canonical_path
from budgetproxy.core.rollout_ids import attempt_episode_id, split_rollout_prefix
from budgetproxy.errors import ProxyError, invalid_episode_id
from budgetproxy.proxy.asgi import Scope
from budgetproxy.proxy.wire import MODEL_ROUTES

_FOLDED = {route.lower(): route for route in MODEL_ROUTES}
MESSAGES_ROUTE = "/v1/messages"
_SLASHES = re.compile(r"/{2,}")


class Destination(NamedTuple):
    """Where a request goes, as `destination` decides it once.

    A model call has its `route` (and the episode its path prefix names, and the rollout whose
    group it joins); anything else goes to the API at `path` (None: the path as the server
    decoded it), unless `refused` answers it (400), in the shape of the API at `path`."""

    route: str | None = None
    path_episode: str | None = None
    rollout: str | None = None
    path: str | None = None
    refused: ProxyError | None = None


# A model route's usual spelling goes as it is, to a destination made once.
_AS_IS = {route.encode(): Destination(route) for route in MODEL_ROUTES}


def destination(scope: Scope) -> Destination:
    """Route a request once: a POST whose raw path is a model route goes as it is; any other
    path is made canonical (`request_path`, a refused spelling is a 400), its
    `/rollout/{rid}/attempt/{aid}` or `/episodes/{id}` prefix taken off, and what is left is
    a model route or the API's path."""
    post = scope["method"] == "POST"
    if post and (as_is := _AS_IS.get(scope.get("raw_path"))) is not None:  # type: ignore[arg-type]
        return as_is
    try:
        path = request_path(scope)
    except PathRefused as e:
        return Destination(path=meant_api(scope["path"]), refused=refused_path(scope, e))
    episode = rollout = None
    tail = path
    if (attempt := split_rollout_prefix(path)) is not None:
        rollout, aid, tail = attempt  # one episode per attempt, the rollout its group
        episode = attempt_episode_id(rollout, aid)
        if episode is None:
            return Destination(path=tail, refused=invalid_episode_id(
                "An attempt id under /rollout/{rid}/attempt/{aid} has no ':' (the episode "
                "{rid}:{aid} would be another attempt's)"))
    elif (split := split_episode_prefix(path)) is not None:
        episode, tail = split
    route = model_route(tail)
    if route is not None:
        if post:
            return Destination(route, episode, rollout)
        if (refusal := other_method(scope)) is not None:
            return Destination(path=route, refused=refusal)
    elif post and (near := near_model_route(tail)) is not None:
        return Destination(path=near, refused=ProxyError(
            404, "not_found", f"No route POST {tail!r}: a model call's path is {near} as it is "
            "spelled, and this one is not forwarded (an upstream that trims it would serve "
            "it uncounted)"))
    if rollout is None and episode is not None and not is_valid_episode_id(episode):
        # (other routes ignore the id, but not a bad one)
        return Destination(path=tail, refused=invalid_episode_id())
    return Destination(path=None if tail == scope["path"] else tail)


# What a model route answers beside POST: the API's own reads (a list of stored chat
# completions), forwarded as they are.
_READS = frozenset(("GET", "HEAD", "OPTIONS"))


def other_method(scope: Scope) -> ProxyError | None:
    """The refusal of a request to a model route that is no POST, when it could be served as
    a model call uncounted by an upstream that reads any method (or a GET's body) as one: a
    method that is not a read is a 405, a read that carries a body a 400; None: a read."""
    if scope["method"] not in _READS:
        return ProxyError(405, "method_not_allowed",
                          f"{scope['method']} is not a method of this route: a model call is a "
                          "POST", headers={"allow": "POST, GET, HEAD, OPTIONS"})
    for name, value in scope["headers"]:
        if (name == b"content-length" and value.strip() not in (b"", b"0")) or (
                name == b"transfer-encoding"):
            return ProxyError(400, "invalid_request",
                              f"A {scope['method']} to a model route carries no body: a model "
                              "call is a POST")
    return None


def near_model_route(path: str) -> str | None:
    """The model route a POST's path that is none could be read as by a lenient upstream (one
    that trims trailing dots, spaces or '?', or takes the last `/v1/...` of a path), or None."""
    trimmed = path.lower().rstrip(". ?")
    return next((route for folded, route in _FOLDED.items() if trimmed.endswith(folded)), None)


def meant_api(said: str) -> str:
    """The API a refused path was meant for, only to pick its error's shape: the Messages
    API's when it names /v1/messages in any spelling (letter case, repeated slashes, a prefix
    whose id holds an encoded slash), else the path as the server decoded it (`said`), its
    `/episodes/{id}` prefix taken off."""
    folded = _SLASHES.sub("/", said.lower())
    if folded.endswith(MESSAGES_ROUTE) or f"{MESSAGES_ROUTE}/" in folded:
        return MESSAGES_ROUTE
    split = split_episode_prefix(said)
    return split[1] if split else said


def request_path(scope: Scope) -> str:
    """The canonical path of the request `scope` describes (core.paths), read from the raw
    path the client sent, never from the server's decoding of it."""
    raw = scope.get("raw_path")
    if isinstance(raw, bytes):
        return canonical_path(raw.decode("latin-1"))
    # a server that gives no raw path: its decoded path, encoded again
    return canonical_path(quote(scope["path"], safe="/"))


def model_route(path: str) -> str | None:
    """The model route a canonical path names, or None. Letter case is folded: an upstream
    that routes case-insensitively would serve /V1/Chat/Completions as a model call, so the
    proxy counts it as one."""
    if path in MODEL_ROUTES:
        return path
    return _FOLDED.get(path.lower())


def refused_path(scope: Scope, refusal: PathRefused) -> ProxyError:
    """The 400 answering a path with no one meaning; one whose episode id segment is at
    fault is a bad episode id, as any other bad id there is."""
    raw = scope.get("raw_path")
    if refusal.segment == 1 and isinstance(raw, bytes) and raw.startswith(b"/episodes/"):
        return invalid_episode_id(f"The episode id in the path is refused: {refusal.reason}")
    return ProxyError(400, "invalid_path", f"Request path refused: {refusal.reason}",
                      param="path")
