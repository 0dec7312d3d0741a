"""Which request headers go upstream: a fixed list an OpenAI- or Anthropic-style API reads,
the operator's additions, and never credentials, episode headers or hop-by-hop ones."""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable

# What an upstream API needs from the client's request (credentials are handled apart:
# the upstream's own api_key, or the client's when the proxy checks no keys of its own).
FORWARDED = frozenset({
    b"accept", b"user-agent",
    b"openai-organization", b"openai-project", b"openai-beta",
    b"anthropic-version", b"anthropic-beta",
    b"idempotency-key", b"x-request-id",
    b"traceparent", b"tracestate",
})
# Never forwarded, whatever `extra` says: the connection's own headers, the proxy's, and
# credentials and client identity the upstream has no business seeing.
NEVER = frozenset({
    b"host", b"content-length", b"content-type", b"connection", b"keep-alive",
    b"transfer-encoding", b"te", b"trailer", b"upgrade", b"expect", b"accept-encoding",
    b"authorization", b"x-api-key", b"proxy-authorization", b"proxy-connection", b"cookie",
    b"forwarded", b"x-forwarded-for", b"x-forwarded-host", b"x-forwarded-proto",
    b"x-real-ip",
})
_CACHE_MAX = 1024


class HeaderPolicy:
    """Decides, per lowercase header name, whether it is forwarded; `extra` are globs of
    further names (server.forward_headers), `never` names of the proxy's own on top of
    NEVER (episode id aliases). Decisions are cached by name."""

    def __init__(self, extra: Iterable[str] = (), never: Iterable[bytes] = ()) -> None:
        self._extra = tuple(p.lower() for p in extra)
        self._never = NEVER | frozenset(never)
        self._seen: dict[bytes, bool] = {}

    def forwarded(self, name: bytes) -> bool:
        seen = self._seen.get(name)
        if seen is not None:
            return seen
        ok = name not in self._never and not name.startswith(b"x-episode-") and (
            name in FORWARDED or any(
                fnmatch.fnmatchcase(name.decode("latin-1"), p) for p in self._extra))
        if len(self._seen) < _CACHE_MAX:
            self._seen[name] = ok
        return ok

    def selected(self, headers: dict[bytes, bytes]) -> dict[str, str]:
        """The headers of a request that are forwarded, as str (latin-1): `forwarded`'s
        decision for each, read from its cache in one pass."""
        seen = self._seen
        out: dict[str, str] = {}
        for name, value in headers.items():
            ok = seen.get(name)
            if ok is None:
                ok = self.forwarded(name)
            if ok:
                out[name.decode("latin-1")] = value.decode("latin-1")
        return out
