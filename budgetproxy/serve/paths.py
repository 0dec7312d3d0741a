"""A request's path as the dispatcher routes it: canonical, refused when it has no one
meaning, and the model route it names whatever its spelling."""

from __future__ import annotations

from urllib.parse import quote

from budgetproxy.core.paths import PathRefused, canonical_path
from budgetproxy.errors import ProxyError, invalid_episode_id
from budgetproxy.proxy.asgi import Scope
from budgetproxy.proxy.wire import MODEL_ROUTES

_FOLDED = {route.lower(): route for route in MODEL_ROUTES}


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
