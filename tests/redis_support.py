"""Test support for the Redis store: the shared Redis, private redis-servers, proxy processes."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import yaml

# The Redis every test may use (CI starts it); tests keep to their own key prefix on it.
REDIS_URL = os.environ.get("BUDGETPROXY_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def require_redis(url: str = REDIS_URL) -> None:
    """Fail (never skip) with a clear message when the Redis the tests need is not there."""
    client = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2)
    try:
        client.ping()
    except redis.RedisError as e:
        pytest.fail(
            f"Redis is not reachable at {url} ({e}). The Redis store tests need it: start one "
            "with `redis-server --port 6379 --save '' --appendonly no` (the CI script does), "
            "or point BUDGETPROXY_TEST_REDIS_URL at one.",
            pytrace=False,
        )
    finally:
        client.close()


def require_redis_server() -> str:
    """The redis-server binary, for tests that stop and restart a Redis of their own."""
    path = shutil.which("redis-server")
    if path is None:
        pytest.fail("redis-server is not installed; the outage tests start their own "
                    "(apt-get install redis-server)", pytrace=False)
    return path


def new_prefix() -> str:
    return f"bptest-{uuid.uuid4().hex[:12]}"


def drop_prefix(prefix: str, url: str = REDIS_URL) -> None:
    """Delete every key a test wrote under `prefix`."""
    client = redis.Redis.from_url(url)
    try:
        keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
        for i in range(0, len(keys), 500):
            client.delete(*keys[i:i + 500])
    finally:
        client.close()


class RedisServer:
    """A private redis-server on a free port in its own directory, to stop and restart at will.

    The append-only file is synced on every write, so the data outlives a restart.
    """

    def __init__(self, directory: Path) -> None:
        self.binary = require_redis_server()
        self.directory = directory
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        argv = [
            self.binary, "--bind", "127.0.0.1", "--port", str(self.port), "--dir",
            str(self.directory), "--save", "", "--appendonly", "yes", "--appendfsync", "always",
        ]
        log = open(self.directory / "redis.log", "ab")  # noqa: SIM115 - owned by the process
        self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + 10
        client = redis.Redis(port=self.port, socket_connect_timeout=0.5)
        try:
            while True:
                try:
                    if client.ping():
                        return self
                except redis.RedisError:
                    pass
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server on {self.port} did not start")
                time.sleep(0.05)
        finally:
            client.close()

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGCONT)
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self.proc = None

    def pause(self) -> None:
        """Freeze the server (SIGSTOP): connections stay open, nothing answers."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def write_config(path: Path, upstream_url: str, **sections: Any) -> Path:
    """A proxy config file: one upstream serving every model, plus `sections`."""
    config: dict[str, Any] = {
        "upstreams": [{"name": "fake", "base_url": upstream_url, "models": ["*"]}],
        **sections,
    }
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


class ProxyProcess:
    """`python -m budgetproxy serve --config FILE --port P` as its own process."""

    def __init__(self, config: Path, log: Path, extra: Sequence[str] = (),
                 env: dict[str, str] | None = None) -> None:
        self.config = config
        self.log = log
        self.extra = list(extra)
        self.env = {**os.environ, **(env or {})}
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def start(self, timeout: float = 60.0) -> ProxyProcess:
        argv = [sys.executable, "-m", "budgetproxy", "serve", "--config", str(self.config),
                "--port", str(self.port), *self.extra]
        out = open(self.log, "ab")  # noqa: SIM115 - owned by the process
        self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=self.env)
        out.close()
        deadline = time.monotonic() + timeout
        while True:
            try:
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"budgetproxy did not start:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.1)

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM, as an orchestrator would; returns the exit code."""
        if self.proc is None:
            return None
        proc, self.proc = self.proc, None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.wait(5)

    def __enter__(self) -> ProxyProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def metric_total(text: str, name: str, **labels: str) -> float:
    """Sum of a metric's samples in Prometheus text whose labels include `labels`."""
    from prometheus_client.parser import text_string_to_metric_families

    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total
