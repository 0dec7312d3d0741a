"""A local aiohttp app on its own event loop in a daemon thread (fake upstream, demo model)."""

from __future__ import annotations

import asyncio
import threading
from types import TracebackType
from typing import Self

from aiohttp import web


class LocalAiohttpServer:
    """Subclasses provide `build_app`; `start()` returns once the socket listens."""

    thread_name = "local-server"

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.host = host
        self.port = port
        self._runner: web.AppRunner | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def build_app(self) -> web.Application:
        raise NotImplementedError

    async def start_async(self) -> None:
        """Start listening on the running event loop."""
        self._runner = web.AppRunner(self.build_app(), access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, backlog=4096)
        await site.start()
        self.port = int(self._runner.addresses[0][1])

    async def stop_async(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def start(self, timeout: float = 20.0) -> Self:
        """Run on a daemon thread with its own event loop; return once listening."""
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                loop.run_until_complete(self.start_async())
            except BaseException as exc:  # noqa: B036 - handed to the starting thread
                failure.append(exc)
                ready.set()
                loop.close()
                return
            ready.set()
            try:
                loop.run_forever()
            finally:
                loop.run_until_complete(self.stop_async())
                loop.close()

        self._thread = threading.Thread(target=run, name=self.thread_name, daemon=True)
        self._thread.start()
        if not ready.wait(timeout):
            raise RuntimeError(f"{self.thread_name} did not start within {timeout:g} s")
        if failure:
            raise RuntimeError(f"{self.thread_name} did not start: {failure[0]}") from failure[0]
        return self

    def stop(self, timeout: float = 10.0) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout)
        self._thread = None
        self._loop = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
