"""Running the proxy: uvicorn settings, the foreground server, and a background-thread server."""

from __future__ import annotations

import asyncio
import gc
import math
import signal
import threading
from typing import Any

import uvicorn

from budgetproxy.config import Config
from budgetproxy.serve.allocator import start_heap_trim
from budgetproxy.serve.http_limits import BoundedConfig, HttpLimits


def _loop_impl() -> str:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return "asyncio"
    return "uvloop"


def uvicorn_config(
    app: Any, config: Config, *, host: str, port: int, **extra: Any
) -> uvicorn.Config:
    """uvicorn on httptools, with the limits of `config.server` enforced by the protocol
    (http_limits.py; under 1 µs more per request than uvicorn's own httptools protocol)."""
    s = config.server
    limits = HttpLimits(
        max_header_bytes=s.max_header_bytes, max_headers=s.max_headers,
        header_timeout_s=s.header_timeout_s, body_timeout_s=s.body_timeout_s,
        max_connections=s.max_connections,
        max_connections_per_client=s.max_connections_per_client,
    )
    return BoundedConfig(
        app,
        limits=limits,
        host=host,
        port=port,
        loop=_loop_impl(),
        lifespan="on",
        access_log=False,
        log_level="warning",
        server_header=False,
        proxy_headers=False,  # the proxy never uses the client address
        timeout_graceful_shutdown=math.ceil(config.server.shutdown_timeout_s),
        timeout_keep_alive=30,
        backlog=4096,
        **extra,
    )


class _AnnouncingServer(uvicorn.Server):
    """Prints the listening URL once the socket is bound (port 0 picks a free one)."""

    def __init__(self, config: uvicorn.Config, announce: bool) -> None:
        super().__init__(config)
        self.announce = announce
        self.bound_port: int | None = None

    def handle_exit(self, sig: int, frame: Any) -> None:
        if self.announce and not self.should_exit:
            name = signal.Signals(sig).name
            print(f"budgetproxy: {name}: draining; calls in flight get up to "
                  f"{self.config.timeout_graceful_shutdown} s (Ctrl-C again stops at once)",
                  flush=True)
        super().handle_exit(sig, frame)

    async def startup(self, sockets: Any = None) -> None:
        await super().startup(sockets)
        for server in getattr(self, "servers", []):
            for sock in server.sockets:
                self.bound_port = sock.getsockname()[1]
                break
            if self.bound_port:
                break
        if self.announce and self.started:
            host = self.config.host
            print(f"budgetproxy listening on http://{host}:{self.bound_port}  "
                  f"(OpenAI base URL: http://{host}:{self.bound_port}/v1)", flush=True)


# Each model call allocates a few hundred short-lived objects; at Python's default gen0
# threshold (700) the collector runs every few calls and keeps walking the app's long-lived
# objects. Measured with bench/run.py at c=32: about 13% less CPU per call and p99 from ~100 ms
# to ~30 ms. Only the serving process is tuned, never a host that embeds ProxyServer.
GC_GEN0_THRESHOLD = 20_000


def tune_gc() -> None:
    """Move start-up objects out of the collector's sight and collect the young less often."""
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GC_GEN0_THRESHOLD, gen1, gen2)


def tune_process(config: Config) -> None:
    """The serving process's collector, and its C heap trimmed (serve/allocator.py)."""
    tune_gc()
    if config.server.malloc_trim_s is not None:
        start_heap_trim(config.server.malloc_trim_s)


def run_foreground(config: Config) -> int:
    """Serve until SIGINT/SIGTERM; in-flight calls finish within server.shutdown_timeout_s."""
    from budgetproxy.serve.app import create_app

    app = create_app(config)
    tune_process(config)
    server = _AnnouncingServer(
        uvicorn_config(app, config, host=config.server.host, port=config.server.port), True
    )
    # uvicorn re-raises the signal it shut down on once it is done; a SIGTERM or Ctrl-C that
    # ended in a clean, drained shutdown must exit 0, so that re-raise lands on a no-op handler.
    previous = {s: signal.signal(s, lambda *_: None) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        server.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if not server.started:
        return 1
    if server.force_exit:
        print("budgetproxy: stopped at once; calls in flight were cut off", flush=True)
        return 130
    print("budgetproxy: stopped after a clean drain", flush=True)
    return 0


class ProxyServer:
    """The real proxy on 127.0.0.1 in a background thread (tests, the demo, embedding)."""

    def __init__(self, config: Config, host: str = "127.0.0.1", port: int = 0,
                 **app_kwargs: Any) -> None:
        from budgetproxy.serve.app import create_app

        self.config = config
        self.app = create_app(config, **app_kwargs)
        self._server = _AnnouncingServer(uvicorn_config(self.app, config, host=host, port=port),
                                         False)
        self._thread: threading.Thread | None = None
        self.host = host

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self._server.bound_port}"

    def start(self, timeout: float = 20.0) -> ProxyServer:
        def run() -> None:
            asyncio.run(self._server.serve())

        self._thread = threading.Thread(target=run, name="budgetproxy", daemon=True)
        self._thread.start()
        import time

        deadline = time.monotonic() + timeout
        # (uvicorn marks the server started inside its startup, before the bound port is read
        # back after it: a caller that looked between the two got a URL without a port)
        while not self._server.started or self._server.bound_port is None:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("budgetproxy did not start")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 30.0) -> None:
        if self._thread is None:
            return
        self._server.should_exit = True
        self._thread.join(timeout)
        self._thread = None

    def __enter__(self) -> ProxyServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
