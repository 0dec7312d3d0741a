"""Upstreams: one shared aiohttp session, and the model-name routing over configured upstreams."""

from __future__ import annotations

import fnmatch

import aiohttp
from yarl import URL

from budgetproxy.config import UpstreamConfig
from budgetproxy.core.paths import wire_path


class UpstreamPool:
    """Routes a model name to the first upstream whose `models` patterns match it."""

    def __init__(self, upstreams: list[UpstreamConfig]) -> None:
        self.upstreams = upstreams
        self._routes: dict[str | None, UpstreamConfig | None] = {}
        self._timeouts = {
            u.name: aiohttp.ClientTimeout(total=u.timeout_s, connect=u.connect_timeout_s)
            for u in upstreams
        }
        self._session: aiohttp.ClientSession | None = None
        self._urls: dict[tuple[str, str], URL] = {}

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, keepalive_timeout=60)
        self._session = aiohttp.ClientSession(
            connector=connector, auto_decompress=True, skip_auto_headers=("User-Agent",)
        )

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
        if self._session is not None:
            await self._session.close()
            self._session = None
