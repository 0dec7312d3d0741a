"""Upstreams: one shared aiohttp session, and the model-name routing over configured upstreams."""

from __future__ import annotations

import fnmatch

import aiohttp

from budgetproxy.config import UpstreamConfig


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
