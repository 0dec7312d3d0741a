"""Test support for the dashboards: the panels' queries, Prometheus and promtool, the real proxy."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
GRAFANA = REPO / "grafana"
DASHBOARD_DIR = GRAFANA / "dashboards"
DATASOURCE = {"type": "prometheus", "uid": "budgetproxy-prometheus"}

# Sample values for the dashboards' template variables, and for Grafana's built-in ones:
# "All" on a multi-value variable becomes its allValue ".*"; time ranges cover a whole test run.
SAMPLE_VALUES: dict[str, str] = {
    "tier": ".*",
    "arm": ".*",
    "outcome": ".*",
    "model": ".*",
    "route": ".*",
    "upstream": ".*",
    "turns": "5|10|20",
    "tokens": "1000|10000|100000",
    "cost": "0.1|1",
    "seconds": "60|600",
    "window": "10m",
    "experiment": ".*",
    "__range": "10m",
    "__rate_interval": "1m",
    "__interval": "15s",
}
HISTOGRAMS = {
    "budgetproxy_episode_turns",
    "budgetproxy_request_duration_seconds",
    "budgetproxy_upstream_duration_seconds",
    "budgetproxy_proxy_overhead_seconds",
    "budgetproxy_time_to_first_token_seconds",
    "budgetproxy_episode_tokens",
    "budgetproxy_episode_cost_usd",
    "budgetproxy_episode_seconds",
}
# The metrics the proxy exports, with the labels each carries (histograms without `le`).
METRICS: dict[str, set[str]] = {
    "budgetproxy_turns_total": {"tier", "disclosure"},
    "budgetproxy_episodes_started_total": {"tier", "disclosure"},
    "budgetproxy_episodes_finished_total": {"tier", "disclosure", "outcome"},
    "budgetproxy_episode_turns": {"tier", "disclosure", "outcome"},
    "budgetproxy_budget_exhausted_total": {"tier", "disclosure"},
    "budgetproxy_request_duration_seconds": {"route"},
    "budgetproxy_upstream_duration_seconds": {"upstream"},
    "budgetproxy_proxy_overhead_seconds": {"route"},
    "budgetproxy_time_to_first_token_seconds": {"model"},
    "budgetproxy_tokens_total": {"model", "direction"},
    "budgetproxy_upstream_errors_total": {"upstream", "class"},
    "budgetproxy_requests_total": {"route", "code"},
    "budgetproxy_active_episodes": set(),
    "budgetproxy_calls_without_episode_total": {"route"},
    "budgetproxy_retained_evictions_total": set(),
    "budgetproxy_trajectory_queue_depth": set(),
    "budgetproxy_store_unavailable_total": {"policy"},
    "budgetproxy_store_degraded": set(),
    "budgetproxy_heap_bytes": {"state"},
    "budgetproxy_trace_spans_total": {"result"},
    "budgetproxy_episodes_exhausted_total": {"tier", "disclosure", "axis"},
    "budgetproxy_episode_tokens": {"tier", "disclosure", "outcome"},
    "budgetproxy_episode_cost_usd": {"tier", "disclosure", "outcome"},
    "budgetproxy_episode_seconds": {"tier", "disclosure", "outcome"},
    # with `experiments` configured (docs/experiments.md)
    "budgetproxy_experiment_episodes": {"experiment", "arm"},
    "budgetproxy_experiment_successes": {"experiment", "arm"},
    "budgetproxy_experiment_estimate": {"experiment", "arm"},
    "budgetproxy_experiment_difference": {"experiment", "bound"},
    "budgetproxy_experiment_decision": {"experiment", "decision"},
}
# The dashboard whose series exist only with experiments configured (its own test run).
EXPERIMENTS_BOARD = "Live experiments"
SERIES_NAMES = {
    f"{name}{suffix}": labels
    for name, labels in METRICS.items()
    for suffix in (("_bucket", "_sum", "_count") if name in HISTOGRAMS else ("",))
}
_VARIABLE = re.compile(r"\$\{(\w+)(?::(\w+))?\}|\$(\w+)|\[\[(\w+)\]\]")


# ---- dashboards ------------------------------------------------------------------------------


def dashboards() -> dict[str, dict[str, Any]]:
    """Every dashboard JSON file in grafana/dashboards, by file name."""
    return {
        p.name: json.loads(p.read_text(encoding="utf-8"))
        for p in sorted(DASHBOARD_DIR.glob("*.json"))
    }


@dataclass(frozen=True)
class PanelQuery:
    dashboard: str
    panel: dict[str, Any]
    target: dict[str, Any]

    @property
    def name(self) -> str:
        return f"{self.dashboard} / {self.panel['title']} / {self.target['refId']}"


def panel_queries() -> list[PanelQuery]:
    """Every target of every panel (rows' nested panels included), in dashboard order."""
    found = []
    for board in dashboards().values():
        for panel in _walk(board["panels"]):
            for target in panel.get("targets", []):
                found.append(PanelQuery(board["title"], panel, target))
    return found


def _walk(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _walk(panel.get("panels", []))


def variables_in(text: str) -> set[str]:
    """Names of the template variables `text` refers to ($x, ${x}, ${x:fmt}, [[x]])."""
    return {next(g for g in m.groups() if g) for m in _VARIABLE.finditer(text)}


def substitute(expr: str, values: Mapping[str, str] | None = None) -> str:
    """`expr` as Grafana would send it, with variables replaced by sample (or given) values."""
    chosen = {**SAMPLE_VALUES, **(values or {})}

    def one(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(3) or m.group(4)
        if name not in chosen:
            raise KeyError(f"no sample value for variable ${name} in {expr!r}")
        return chosen[name]

    return _VARIABLE.sub(one, expr)


# ---- binaries --------------------------------------------------------------------------------


def require_binary(name: str) -> str:
    """Path of a Prometheus binary; fails (never skips) the test when it is not installed."""
    path = shutil.which(name) or (
        f"/usr/bin/{name}" if os.access(f"/usr/bin/{name}", os.X_OK) else None
    )
    if path is None:
        pytest.fail(
            f"`{name}` is not installed (neither on PATH nor in /usr/bin). The dashboard tests "
            f"need a real Prometheus: install Debian's `prometheus` package (it ships `{name}`).",
            pytrace=False,
        )
    return path


def promtool(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [require_binary("promtool"), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(check: Callable[[], bool], timeout: float, what: str, interval: float = 0.2) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():
                return
        except (httpx.HTTPError, OSError):
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def _stop(proc: subprocess.Popen[bytes], timeout: float = 15) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def _tail(path: Path, n: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


# ---- Prometheus ------------------------------------------------------------------------------


class PromQueryError(AssertionError):
    """Prometheus rejected a query or answered with an error."""


class Prometheus:
    """A real Prometheus server on 127.0.0.1 with its own config and storage in `workdir`."""

    def __init__(self, workdir: Path, scrape_targets: list[str], scrape_interval: str = "1s"):
        self.workdir = workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = {
            "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
            "scrape_configs": [
                {
                    "job_name": "budgetproxy",
                    "scrape_interval": scrape_interval,
                    "scrape_timeout": scrape_interval,
                    "static_configs": [{"targets": scrape_targets}],
                }
            ],
        }
        self.config_path = workdir / "prometheus.yml"
        self.config_path.write_text(yaml.safe_dump(config))
        self.log_path = workdir / "prometheus.log"
        self._proc: subprocess.Popen[bytes] | None = None
        self.http = httpx.Client(base_url=self.url, timeout=10)

    def start(self) -> Prometheus:
        binary = require_binary("prometheus")
        with self.log_path.open("wb") as log:
            self._proc = subprocess.Popen(
                [
                    binary,
                    f"--config.file={self.config_path}",
                    f"--storage.tsdb.path={self.workdir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--storage.tsdb.retention.time=1h",
                    "--log.level=warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
            )
        try:
            wait_until(self._ready, 30, "Prometheus to become ready")
        except TimeoutError as e:
            self.stop()
            raise AssertionError(f"{e}; its log:\n{_tail(self.log_path)}") from None
        return self

    def _ready(self) -> bool:
        assert self._proc is not None
        if self._proc.poll() is not None:
            raise AssertionError(f"Prometheus exited early:\n{_tail(self.log_path)}")
        return self.http.get("/-/ready").status_code == 200

    def stop(self) -> None:
        self.http.close()
        if self._proc is not None:
            _stop(self._proc)
            self._proc = None

    def _api(self, path: str, params: dict[str, str] | None = None) -> Any:
        resp = self.http.post(path, data=params) if params else self.http.get(path)
        try:
            body = resp.json()
        except ValueError:
            raise PromQueryError(f"{resp.status_code} {resp.text[:500]}") from None
        if body.get("status") != "success":
            query = (params or {}).get("query")
            raise PromQueryError(f"{body.get('errorType')}: {body.get('error')} (query: {query})")
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """Instant query: the result vector (or a scalar wrapped as one unlabelled sample)."""
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        data = self._api("/api/v1/query", params)
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        return list(data["result"])

    def query_range(self, expr: str, start: float, end: float, step: str) -> list[dict[str, Any]]:
        params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": step}
        return list(self._api("/api/v1/query_range", params)["result"])

    def value(self, expr: str) -> float:
        """The single value of an instant query that must return exactly one sample."""
        result = self.query(expr)
        if len(result) != 1:
            raise AssertionError(f"expected one sample, got {len(result)}: {result} for {expr}")
        return float(result[0]["value"][1])

    def targets_up(self) -> bool:
        active = self._api("/api/v1/targets")["activeTargets"]
        return bool(active) and all(t["health"] == "up" for t in active)


# ---- the proxy -------------------------------------------------------------------------------


class Proxy:
    """`python -m budgetproxy serve` as a subprocess on 127.0.0.1, in front of `upstream`."""

    def __init__(self, workdir: Path, upstream: str, *extra_args: str,
                 env: dict[str, str] | None = None):
        self.workdir = workdir
        self.env = env
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = workdir / "proxy.log"
        self.args = [
            sys.executable,
            "-m",
            "budgetproxy",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--upstream",
            upstream,
            "--log-dir",
            str(workdir / "trajectories"),
            *extra_args,
        ]
        if "--config" not in extra_args:
            # the fake upstream's X-Fake-* steering headers reach it only when named
            config = workdir / "proxy.yaml"
            config.write_text("server: {forward_headers: [x-fake-*]}\n")
            self.args += ["--config", str(config)]
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Proxy:
        with self.log_path.open("wb") as log:
            self._proc = subprocess.Popen(
                self.args, stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir,
                env={**os.environ, **self.env} if self.env else None,
            )
        try:
            wait_until(self._healthy, 30, "the proxy's /healthz")
        except TimeoutError as e:
            self.stop()
            raise AssertionError(f"{e}; its output:\n{_tail(self.log_path)}") from None
        return self

    def _healthy(self) -> bool:
        assert self._proc is not None
        if self._proc.poll() is not None:
            raise AssertionError(
                f"`budgetproxy serve` exited with {self._proc.returncode}:\n{_tail(self.log_path)}"
            )
        return httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200

    def stop(self) -> None:
        if self._proc is not None:
            _stop(self._proc)
            self._proc = None

    def metrics_text(self) -> str:
        resp = httpx.get(f"{self.url}/metrics", timeout=10)
        resp.raise_for_status()
        return resp.text
