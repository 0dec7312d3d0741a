"""Shared fixtures: fake upstreams, the real proxy server on an ephemeral port, log readers."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
import openai
import pytest
from hypothesis import settings

from budgetproxy.config import load_config
from budgetproxy.serve.server import ProxyServer
from budgetproxy.testing import FakeUpstream

# Two shared cores: a per-example deadline would only measure the neighbours' load.
settings.register_profile("shared-machine", deadline=None)
settings.load_profile("shared-machine")


class WatchedUpstream(FakeUpstream):
    """A fake upstream that also notes how each SSE stream ended: "done" or "closed"."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stream_ends: list[tuple[str, float]] = []

    async def _sse(self, request: Any, events: Any) -> Any:
        try:
            resp = await super()._sse(request, events)
        except (ConnectionError, asyncio.CancelledError):
            self.stream_ends.append(("closed", time.monotonic()))
            raise
        except Exception as e:  # aiohttp's own "closing transport" errors
            if "clos" in str(e).lower() or "reset" in str(e).lower():
                self.stream_ends.append(("closed", time.monotonic()))
            raise
        self.stream_ends.append(("done", time.monotonic()))
        return resp


@pytest.fixture(scope="session")
def upstream() -> Iterator[WatchedUpstream]:
    """The main fake upstream, shared by every test (identify your requests by what you sent)."""
    up = WatchedUpstream(models=["m1", "m2", "shared"]).start()
    yield up
    up.stop()


@pytest.fixture(scope="session")
def upstream2() -> Iterator[FakeUpstream]:
    """A second fake upstream, for routing and model-list merging."""
    up = FakeUpstream(models=["other-1", "shared"]).start()
    yield up
    up.stop()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def new_id(prefix: str = "ep") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def unmarked(value: Any) -> Any:
    """A value without cache_control markers (which clients move every turn)."""
    if isinstance(value, list):
        return [unmarked(v) for v in value]
    if isinstance(value, dict):
        return {k: unmarked(v) for k, v in value.items() if k != "cache_control"}
    return value


T = TypeVar("T")


def eventually(read: Callable[[], T], ready: Callable[[T], bool], timeout: float = 10.0) -> T:
    """`read()` once `ready` holds for what it returns, or its last value after `timeout`
    seconds: for what the proxy writes after an answer is sent (a streamed call's settle, its
    records, its metrics)."""
    deadline = time.monotonic() + timeout
    while True:
        value = read()
        if ready(value) or time.monotonic() > deadline:
            return value
        time.sleep(0.02)


def read_jsonl(directory: Path) -> list[dict[str, Any]]:
    """Every record in every JSONL file under `directory`, in file then line order.

    A live log's last line may be cut short by a write still under way (a reader can see part
    of one `write`): only lines ended by a newline are read."""
    out: list[dict[str, Any]] = []
    for path in sorted(directory.glob("*.jsonl")):
        lines = path.read_text(encoding="utf-8").split("\n")
        for line in lines[:-1]:  # the last is "" or a line still being written
            if line.strip():
                out.append(json.loads(line))
    return out


class _KeptClient(httpx.Client):
    """A client shared by a proxy's tests: `with` blocks leave it open; the proxy closes it."""

    def __enter__(self) -> _KeptClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


@dataclass
class Proxy:
    """A running proxy and the handles a test needs."""

    server: ProxyServer
    log_dir: Path
    overrides: dict[str, Any]
    _clients: list[Any] = field(default_factory=list)
    _shared: _KeptClient | None = None
    _sdk_http: httpx.Client | None = None

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def base_url(self) -> str:
        return self.server.url + "/v1"

    def client(self, **kwargs: Any) -> openai.OpenAI:
        """The official client bound to this proxy; no SDK retries unless asked for."""
        kwargs.setdefault("base_url", self.base_url)
        kwargs.setdefault("api_key", "sk-client-secret-0000")
        kwargs.setdefault("max_retries", 0)
        kwargs.setdefault("timeout", 20.0)
        if self._sdk_http is None:  # one connection pool: building a client costs ~70 ms
            self._sdk_http = openai.DefaultHttpxClient()
        kwargs.setdefault("http_client", self._sdk_http)
        return openai.OpenAI(**kwargs)

    def async_client(self, **kwargs: Any) -> openai.AsyncOpenAI:
        kwargs.setdefault("base_url", self.base_url)
        kwargs.setdefault("api_key", "sk-client-secret-0000")
        kwargs.setdefault("max_retries", 0)
        kwargs.setdefault("timeout", 20.0)
        return openai.AsyncOpenAI(**kwargs)

    def http(self, **kwargs: Any) -> httpx.Client:
        """A plain HTTP client on the proxy's URL (shared unless options are given)."""
        if not kwargs:
            if self._shared is None:
                self._shared = _KeptClient(base_url=self.url, timeout=20.0)
            return self._shared
        kwargs.setdefault("base_url", self.url)
        kwargs.setdefault("timeout", 20.0)
        c = httpx.Client(**kwargs)
        self._clients.append(c)
        return c

    def records(self, **match: Any) -> list[dict[str, Any]]:
        """Records written so far whose fields equal `match`."""
        return [
            r for r in read_jsonl(self.log_dir) if all(r.get(k) == v for k, v in match.items())
        ]

    def wait_records(
        self, n: int = 1, timeout: float = 5.0, **match: Any
    ) -> list[dict[str, Any]]:
        """Wait until at least `n` matching records are on disk (the writer runs off the path)."""
        deadline = time.monotonic() + timeout
        while True:
            found = self.records(**match)
            if len(found) >= n or time.monotonic() > deadline:
                return found
            time.sleep(0.02)

    def episode(self, episode_id: str) -> dict[str, Any]:
        r = self.http().get(f"/v1/episodes/{episode_id}")
        assert r.status_code == 200, r.text
        data: dict[str, Any] = r.json()
        return data

    def stop(self) -> None:
        for c in [*self._clients, self._sdk_http]:
            if c is not None:
                c.close()
        if self._shared is not None:
            self._shared.close()
        self._clients.clear()
        self.server.stop()


ProxyFactory = Callable[..., Proxy]


def _start_proxy(
    overrides: dict[str, Any], log_dir: Path, upstream: FakeUpstream
) -> Proxy:
    over = dict(overrides)
    over.setdefault("upstreams", [{"name": "main", "base_url": upstream.base_url}])
    traj = dict(over.get("trajectories", {}))
    traj.setdefault("dir", str(log_dir))
    over["trajectories"] = traj
    over.setdefault("metrics", {"enabled": False})
    # The fake upstream is steered by X-Fake-* request headers (and tests mark requests with
    # X-Test-*), which only reach it when the proxy is told to forward them.
    over["server"] = {"forward_headers": ["x-fake-*", "x-test-*"], **over.get("server", {})}
    server = ProxyServer(load_config(None, over)).start()
    return Proxy(server, Path(traj["dir"]), over)


@pytest.fixture(scope="module")
def proxy(
    upstream: WatchedUpstream, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ProxyFactory]:
    """`proxy(overrides, fresh=False)` → a running real proxy with those config overrides.

    Proxies with equal overrides are shared within a module (tests use their own episode ids);
    `fresh=True` always starts a new one. Every proxy stops when the module ends.
    """
    started: dict[str, Proxy] = {}
    extra: list[Proxy] = []
    lock = threading.Lock()

    def make(overrides: dict[str, Any] | None = None, *, fresh: bool = False) -> Proxy:
        overrides = overrides or {}
        key = json.dumps(overrides, sort_keys=True)
        with lock:
            if not fresh and key in started:
                return started[key]
            p = _start_proxy(overrides, tmp_path_factory.mktemp("traj"), upstream)
            if fresh:
                extra.append(p)
            else:
                started[key] = p
            return p

    yield make
    for p in [*started.values(), *extra]:
        p.stop()


@pytest.fixture(scope="module")
def default_proxy(proxy: ProxyFactory) -> Proxy:
    return proxy({})


def nested(depth: int) -> list[Any]:
    """Lists `depth` deep: past what orjson (254 levels) or the stdlib's recursion can write."""
    out: list[Any] = []
    cur = out
    for _ in range(depth):
        nxt: list[Any] = []
        cur.append(nxt)
        cur = nxt
    return out


def chat_body(text: str = "hello", model: str = "m1", **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": text}], **extra}


def assert_openai_error(
    resp: httpx.Response, status: int, code: str, param: str | None | type = type
) -> dict[str, Any]:
    """An error the proxy itself returns: OpenAI-shaped, and 4xx carry x-should-retry: false."""
    assert resp.status_code == status, (resp.status_code, resp.text)
    body = resp.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert set(err) >= {"message", "type", "param", "code"}, err
    assert err["code"] == code, err
    assert isinstance(err["message"], str) and err["message"]
    if param is not type:
        assert err["param"] == param, err
    if 400 <= status < 500:
        assert resp.headers.get("x-should-retry") == "false", dict(resp.headers)
    return dict(err)


@pytest.fixture
def spliced_bodies(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Whether each disclosed body the in-process proxies wrote was written from the previous
    turn's (proxy/spliced.py `spliced`; False: it was written whole), in order."""
    from budgetproxy.proxy import spliced

    made: list[bool] = []
    real = spliced.spliced

    def counted(*args: Any) -> bytes | None:
        out = real(*args)
        made.append(out is not None)
        return out

    monkeypatch.setattr(spliced, "spliced", counted)
    return made
