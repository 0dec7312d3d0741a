"""A real Phoenix (arize-phoenix, pinned in .ci/phoenix/requirements.txt) for the trace tests:
installed by the tests into a venv of its own, started on 127.0.0.1, read over its REST API."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
HOME = ROOT / ".ci" / "phoenix"
VENV = HOME / "venv"
REQUIREMENTS = HOME / "requirements.txt"
INSTALL = ("python -m venv .ci/phoenix/venv && "
           ".ci/phoenix/venv/bin/pip install -r .ci/phoenix/requirements.txt")


def pinned_version() -> str:
    for line in REQUIREMENTS.read_text().splitlines():
        if line.startswith("arize-phoenix=="):
            return line.split("==", 1)[1].strip()
    raise AssertionError("arize-phoenix is not pinned in .ci/phoenix/requirements.txt")


def _installed_version() -> str | None:
    python = VENV / "bin" / "python"
    if not (VENV / "bin" / "phoenix").exists() or not python.exists():
        return None
    done = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m; print(m.version('arize-phoenix'))"],
        capture_output=True, text=True, check=False, timeout=120)
    return done.stdout.strip() if done.returncode == 0 else None


def ensure_phoenix(timeout: float = 1800.0) -> Path:
    """The `phoenix` command of .ci/phoenix/venv, installing the pins when it is missing or
    another version; a failure (never a skip) with the command to run when that fails."""
    if _installed_version() == pinned_version():
        return VENV / "bin" / "phoenix"
    steps = [[sys.executable, "-m", "venv", str(VENV)],
             [str(VENV / "bin" / "pip"), "install", "-q", "--disable-pip-version-check",
              "-r", str(REQUIREMENTS)]]
    for argv in steps:
        try:
            done = subprocess.run(argv, capture_output=True, text=True, check=False,
                                  timeout=timeout)
        except (OSError, subprocess.TimeoutExpired) as e:
            pytest.fail(f"installing Phoenix failed ({e}): run {INSTALL}", pytrace=False)
        if done.returncode != 0:
            tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-4:])
            pytest.fail(f"installing Phoenix failed (exit {done.returncode}: {tail}): "
                        f"run {INSTALL}", pytrace=False)
    if _installed_version() != pinned_version():
        pytest.fail(f"Phoenix {pinned_version()} is not in {VENV} after installing: run {INSTALL}",
                    pytrace=False)
    return VENV / "bin" / "phoenix"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Phoenix:
    """A running Phoenix: its HTTP root (the UI, the REST API and OTLP/HTTP at /v1/traces)."""

    url: str

    def spans(self, project: str) -> list[dict[str, Any]]:
        r = httpx.get(f"{self.url}/v1/projects/{project}/spans", params={"limit": 1000},
                      timeout=20)
        if r.status_code == 404:  # no span has reached the project yet
            return []
        r.raise_for_status()
        data: list[dict[str, Any]] = r.json()["data"]
        return data

    def sessions(self, project: str) -> list[dict[str, Any]]:
        r = httpx.get(f"{self.url}/v1/projects/{project}/sessions", timeout=20)
        r.raise_for_status()
        data: list[dict[str, Any]] = r.json()["data"]
        return data

    def wait_spans(self, project: str, n: int, timeout: float = 60.0) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while True:
            found = self.spans(project)
            if len(found) >= n or time.monotonic() > deadline:
                return found
            time.sleep(0.5)


def run_phoenix(workdir: Path, startup_s: float = 300.0) -> Iterator[Phoenix]:
    """Phoenix on free ports of 127.0.0.1 with its database under `workdir`, until closed."""
    exe = ensure_phoenix()
    port, grpc = _free_port(), _free_port()
    env = {**os.environ, "PHOENIX_HOST": "127.0.0.1", "PHOENIX_PORT": str(port),
           "PHOENIX_GRPC_PORT": str(grpc), "PHOENIX_WORKING_DIR": str(workdir),
           "PHOENIX_TELEMETRY_ENABLED": "false", "PYTHONPATH": ""}
    log = (workdir / "phoenix.log").open("wb")
    proc = subprocess.Popen([str(exe), "serve"], env=env, stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + startup_s
        while True:
            if proc.poll() is not None:
                pytest.fail(f"phoenix serve exited with {proc.returncode}: "
                            + (workdir / "phoenix.log").read_text(errors="replace")[-800:])
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"phoenix serve did not answer within {startup_s:.0f} s")
            time.sleep(0.5)
        yield Phoenix(url)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        log.close()
