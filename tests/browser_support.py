"""A real headless Chromium for tests, driven over the DevTools protocol (websockets).

Debian's `chromium` package; `.ci/run` installs it. A test that needs the browser fails, not
skips, when it is missing. Each browser gets a fresh profile folder and every network feature
Chromium would use on its own is off.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from websockets.sync.client import ClientConnection, connect

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run",
         "--remote-debugging-port=0", "--remote-allow-origins=*")  # fmt: skip


def chromium_binary() -> str:
    for name in ("chromium", "chromium-browser"):
        if path := shutil.which(name):
            return path
    pytest.fail("headless Chromium is not installed: apt-get install -y chromium")


class Tab:
    """One page of the browser: navigate, read the DOM through JavaScript, click."""

    def __init__(self, browser: Browser, session: str) -> None:
        self.browser, self.session = browser, session

    def send(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.browser.send(method, params, self.session)

    def goto(self, url: str) -> None:
        self.browser.events.clear()
        self.send("Page.navigate", {"url": url})
        self.wait_loaded()

    def wait_loaded(self, timeout: float = 20.0) -> None:
        self.browser.wait_event("Page.loadEventFired", self.session, timeout)

    def eval(self, expression: str) -> Any:
        result = self.send("Runtime.evaluate", {"expression": expression,
                                                "returnByValue": True})  # fmt: skip
        if "exceptionDetails" in result:
            raise AssertionError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def click(self, selector: str) -> None:
        """Click the element and wait for the page it leads to."""
        self.browser.events.clear()
        self.eval(f"document.querySelector({json.dumps(selector)}).click()")
        self.wait_loaded()

    @property
    def url(self) -> str:
        return str(self.eval("location.href"))

    def screenshot(self) -> bytes:
        data = self.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport":
                                                    True})  # fmt: skip
        return base64.b64decode(data["data"])


class Browser:
    """A headless Chromium and its DevTools connection; events are kept until cleared."""

    def __init__(self, proc: subprocess.Popen[str], ws: ClientConnection) -> None:
        self.proc, self.ws = proc, ws
        self.events: list[dict[str, Any]] = []
        self.console: list[str] = []
        self._next = 0

    def send(self, method: str, params: dict[str, Any] | None = None,
             session: str | None = None) -> dict[str, Any]:
        self._next += 1
        message: dict[str, Any] = {"id": self._next, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        self.ws.send(json.dumps(message))
        while True:
            reply = self._receive(30.0)
            if reply.get("id") == self._next:
                if "error" in reply:
                    raise AssertionError(f"{method}: {reply['error']}")
                result: dict[str, Any] = reply.get("result", {})
                return result

    def _receive(self, timeout: float) -> dict[str, Any]:
        message: dict[str, Any] = json.loads(self.ws.recv(timeout=timeout))
        if "method" in message:
            self.events.append(message)
            if message["method"] == "Runtime.exceptionThrown":
                self.console.append(json.dumps(message["params"]))
            if message["method"] == "Log.entryAdded":
                self.console.append(message["params"]["entry"].get("text", ""))
        return message

    def wait_event(self, method: str, session: str, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            for event in self.events:
                if event["method"] == method and event.get("sessionId") == session:
                    return event
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {method} within {timeout}s")
            self._receive(left)

    def new_tab(self) -> Tab:
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target,
                                                      "flatten": True})["sessionId"]
        tab = Tab(self, session)
        for domain in ("Page", "Runtime", "Log"):
            tab.send(f"{domain}.enable")
        return tab


@contextmanager
def chromium() -> Iterator[Browser]:
    """A fresh headless Chromium (its own profile), closed afterwards."""
    profile = tempfile.mkdtemp(prefix="chromium-profile-")
    proc = subprocess.Popen(
        [chromium_binary(), *FLAGS, f"--user-data-dir={profile}", "about:blank"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        url, lines = None, []
        deadline = time.monotonic() + 30
        while url is None and time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line and proc.poll() is not None:
                break
            lines.append(line)
            if line.startswith("DevTools listening on "):
                url = line.split(" on ", 1)[1].strip()
        if url is None:
            pytest.fail("Chromium did not start:\n" + "".join(lines[-20:]))
        # Chromium keeps writing to stderr; drain it so it never blocks on a full pipe.
        import threading

        threading.Thread(target=proc.stderr.read, daemon=True).start()
        with connect(url, max_size=None, open_timeout=20) as ws:
            yield Browser(proc, ws)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(profile, ignore_errors=True)
