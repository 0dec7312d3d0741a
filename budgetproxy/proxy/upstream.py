"""Upstreams: their connections (budgetproxy's HTTP/1.1 client for plain-HTTP model calls,
one shared aiohttp session for the rest), and the model-name routing over them."""

from __future__ import annotations

import fnmatch
import logging
from collections.abc import AsyncIterator, Callable
from functools import partial
from typing import Protocol

import aiohttp
from yarl import URL

from budgetproxy.config import UpstreamConfig
from budgetproxy.core.paths import wire_path
from budgetproxy.proxy import h1

log = logging.getLogger("budgetproxy")


class UpstreamResponse(Protocol):
    """An upstream's answer to a model call, whichever client carried it (h1.Response)."""

    status: int
    headers: list[tuple[str, str]]  # names lowercased

    def header(self, name: str) -> str | None: ...
    async def read(self) -> bytes: ...
    def iter_any(self) -> AsyncIterator[bytes]: ...
    def release(self) -> None: ...


class AiohttpResponse:
    """An aiohttp answer behind UpstreamResponse's face (HTTPS upstreams)."""

    __slots__ = ("_resp", "status", "headers")

    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self._resp = resp
        self.status = resp.status
        self.headers = [(k.lower(), v) for k, v in resp.headers.items()]

    def header(self, name: str) -> str | None:
        return self._resp.headers.get(name)

    async def read(self) -> bytes:
        return await self._resp.read()

    def iter_any(self) -> AsyncIterator[bytes]:
        return self._resp.content.iter_any()

    def release(self) -> None:
        self._resp.release()


class UpstreamPool:
    """Routes a model name to the first upstream whose `models` patterns match it."""

    def __init__(self, upstreams: list[UpstreamConfig],
                 on_desync: Callable[[str], None] | None = None) -> None:
        self.upstreams = upstreams
        self.on_desync = on_desync  # (the upstream's name) after h1.Origin stops reusing
        self._routes: dict[str | None, UpstreamConfig | None] = {}
        self._timeouts = {
            u.name: aiohttp.ClientTimeout(total=u.timeout_s, connect=u.connect_timeout_s)
            for u in upstreams
        }
        self._session: aiohttp.ClientSession | None = None
        self._urls: dict[tuple[str, str], URL] = {}
        self._origins: dict[str, h1.Origin] = {}  # by upstream name: those h1 carries
        self._targets: dict[tuple[str, str, str], tuple[bytes, bytes]] = {}

    async def start(self) -> None:
        for u in self.upstreams:
            url = URL(u.base_url)
            if (u.http_client == "builtin" and url.scheme == "http" and url.raw_host
                    and url.user is None):  # (credentials in the URL: aiohttp sends them)
                self._origins[u.name] = h1.Origin(
                    url.raw_host, url.port or 80, quiet_s=u.reuse_quiet_s,
                    reuse=u.reuse_connections, on_desync=partial(self._desynced, u.name))
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, keepalive_timeout=60)
        self._session = aiohttp.ClientSession(
            connector=connector, auto_decompress=True, skip_auto_headers=("User-Agent",)
        )

    def _desynced(self, name: str, why: str) -> None:
        log.error("upstream %r sent an answer no request asked for (%s): its connections are "
                  "no longer reused, one call per connection from now on; fix the upstream, "
                  "or set reuse_connections: false for it", name, why)
        if self.on_desync is not None:
            self.on_desync(name)

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("upstream pool not started")
        return self._session

    def timeout(self, upstream: UpstreamConfig) -> aiohttp.ClientTimeout:
        return self._timeouts[upstream.name]

    def url(self, upstream: UpstreamConfig, path: str, query: str = "") -> URL:
        """The upstream URL for a canonical proxy path under /v1 (core.paths) and a query
        from `wire_query`: the path's tail below the upstream's base URL, built as encoded so
        that neither yarl nor aiohttp normalises it again (nothing can climb out of the base
        path, and what is sent is what was routed)."""
        key = (upstream.base_url, path)
        url = self._urls.get(key) if not query else None
        if url is None:
            tail = wire_path(path[3:]) if path.startswith("/v1/") else ""
            url = URL(upstream.base_url + tail + (f"?{query}" if query else ""), encoded=True)
            if not query and len(self._urls) < 1024:
                self._urls[key] = url
        return url

    async def post(self, upstream: UpstreamConfig, path: str, query: str,
                   headers: dict[str, str], body: bytes) -> UpstreamResponse:
        """POST a model call's body to `upstream` (path and query as for `url`); the answer
        once its head is read. Raises TimeoutError, OSError or aiohttp.ClientError."""
        origin = self._origins.get(upstream.name)
        if origin is None:
            resp = await self.session.post(
                self.url(upstream, path, query), data=body, headers=headers,
                timeout=self._timeouts[upstream.name], allow_redirects=False)
            return AiohttpResponse(resp)
        key = (upstream.name, path, query)
        target = self._targets.get(key)
        if target is None:
            url = self.url(upstream, path, query)
            host = url.raw_host or ""
            if ":" in host:  # an IPv6 literal
                host = f"[{host}]"
            if url.explicit_port is not None and url.explicit_port != 80:
                host = f"{host}:{url.explicit_port}"
            target = (url.raw_path_qs.encode("ascii"), host.encode("ascii"))
            if len(self._targets) < 1024:
                self._targets[key] = target
        return await origin.post(target[0], target[1], headers, body,
                                 timeout_s=upstream.timeout_s,
                                 connect_timeout_s=upstream.connect_timeout_s)

    def route(self, model: str | None) -> UpstreamConfig | None:
        try:
            return self._routes[model]
        except KeyError:
            pass
        found = None
        for u in self.upstreams:
            if any(p == "*" or fnmatch.fnmatchcase(model or "", p) for p in u.models):
                found = u
                break
        if len(self._routes) < 4096:
            self._routes[model] = found
        return found

    async def close(self) -> None:
        for origin in self._origins.values():
            origin.close()
        if self._session is not None:
            await self._session.close()
            self._session = None
