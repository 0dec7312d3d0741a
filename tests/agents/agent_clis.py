"""The real agent CLIs (pinned in .ci/node), run offline against a proxy in a home of their own."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

NODE = Path(__file__).resolve().parents[2] / ".ci" / "node"
BIN = NODE / "node_modules" / ".bin"
INSTALL = "npm ci --prefix .ci/node --no-audit --no-fund"
STRACE_INSTALL = "apt-get install strace"
# Each pinned package and the command it installs under node_modules/.bin.
COMMANDS = {"@openai/codex": "codex", "@anthropic-ai/claude-code": "claude"}


def missing_clis(node: Path = NODE) -> list[str]:
    """The pinned packages (.ci/node/package.json) not installed at their pinned version."""
    pins: dict[str, str] = json.loads((node / "package.json").read_text())["dependencies"]
    out = []
    for package, version in pins.items():
        installed = node / "node_modules" / package / "package.json"
        command = node / "node_modules" / ".bin" / COMMANDS.get(package, package)
        try:
            found = json.loads(installed.read_text()).get("version")
        except (OSError, ValueError):
            found = None
        if found != version or not command.exists():
            out.append(f"{package}@{version}")
    return out


def ensure_clis(node: Path = NODE, which: Callable[[str], str | None] = shutil.which,
                timeout: float = 900.0) -> None:
    """Install the pinned CLIs with npm when any is missing; fail (never skip) with the one
    command to run when npm is not there or the install fails, and when strace is missing."""
    if which("strace") is None:
        pytest.fail(f"strace is not installed (the agent tests log what the CLIs connect to): "
                    f"run {STRACE_INSTALL}", pytrace=False)
    missing = missing_clis(node)
    if not missing:
        return
    npm = which("npm")
    if npm is None:
        pytest.fail(f"the agent CLIs ({', '.join(missing)}) are not installed and npm is not "
                    f"on PATH: install Node.js with npm, then run {INSTALL}", pytrace=False)
    done = subprocess.run([npm, "ci", "--prefix", str(node), "--no-audit", "--no-fund",
                           "--loglevel=error"], capture_output=True, text=True,
                          timeout=timeout, check=False)
    still = missing_clis(node)
    if done.returncode != 0 or still:
        tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
        pytest.fail(f"{INSTALL} failed (exit {done.returncode}; missing {', '.join(still)}): "
                    + " | ".join(tail), pytrace=False)

# What keeps each CLI off the network and away from a login: Codex reads its provider's key
# from `env_key`, checks for updates only when asked, and syncs its plugin marketplace (a git
# clone) unless the plugin features are off; Claude Code takes ANTHROPIC_API_KEY as is and
# sends no telemetry, error reports or update checks with these set.
CODEX_CONFIG = """\
model = "{model}"
model_provider = "budgetproxy"
check_for_update_on_startup = false

[model_providers.budgetproxy]
name = "budgetproxy"
base_url = "{base_url}"
wire_api = "responses"
env_key = "BUDGETPROXY_KEY"

[analytics]
enabled = false

[features]
plugins = false
remote_plugin = false
apps = false
"""

CLAUDE_ENV = {
    "ANTHROPIC_API_KEY": "sk-ant-client-0000",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "DISABLE_AUTOUPDATER": "1",
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
}


@dataclass
class Run:
    """One finished CLI run."""

    returncode: int
    stdout: str
    stderr: str
    seconds: float

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def cli(name: str) -> Path:
    """The CLI's path; a failure (never a skip) when it is not installed."""
    path = BIN / name
    if not path.exists():
        pytest.fail(f"{name} is not installed at {path}: run {INSTALL}")
    return path


_ADDRESS = re.compile(r'sin6?_port=htons\((\d+)\).*?inet_(?:addr\("|pton\(AF_INET6, ")([^"]+)"')


def connections(trace: Path) -> set[tuple[str, int]]:
    """The (address, port) pairs an strace connect log shows the process tree connecting to."""
    return {(m.group(2), int(m.group(1)))
            for m in map(_ADDRESS.search, trace.read_text(encoding="utf-8").splitlines()) if m}


def proxy_address(p: Any) -> tuple[str, int]:
    """A running proxy's (address, port), as `connections` reports it."""
    url = urlsplit(p.url)
    assert url.hostname is not None and url.port is not None
    return url.hostname, url.port


def _run(argv: list[str], home: Path, env: dict[str, str], timeout: float,
         trace: Path | None) -> Run:
    work = home / "work"
    work.mkdir(parents=True, exist_ok=True)
    if trace is not None:
        strace = shutil.which("strace")
        if strace is None:
            pytest.fail(f"strace is not installed: run {STRACE_INSTALL}")
        argv = [strace, "-f", "-qq", "-e", "trace=connect", "-o", str(trace), *argv]
    t0 = time.monotonic()
    done = subprocess.run(
        argv, cwd=work, env={"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(home), **env},
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout, check=False,
    )
    return Run(done.returncode, done.stdout, done.stderr, time.monotonic() - t0)


def codex_exec(base_url: str, home: Path, prompt: str, *, model: str = "m1",
               timeout: float = 60.0, trace: Path | None = None) -> Run:
    """`codex exec PROMPT` with a config.toml provider whose base_url is `base_url`; under
    strace, its connections logged to `trace`, when given."""
    codex_home = home / ".codex"
    codex_home.mkdir(parents=True, exist_ok=True)
    (codex_home / "config.toml").write_text(
        CODEX_CONFIG.format(model=model, base_url=base_url), encoding="utf-8")
    env = {"CODEX_HOME": str(codex_home), "BUDGETPROXY_KEY": "sk-client-secret-0000"}
    return _run([str(cli("codex")), "exec", "--skip-git-repo-check", prompt], home, env,
                timeout, trace)


def claude_print(base_url: str, home: Path, prompt: str, *, session_id: str,
                 model: str = "claude-sonnet-4-5", timeout: float = 60.0,
                 trace: Path | None = None, tools: str = "Read", resume: bool = False) -> Run:
    """`claude -p PROMPT` with ANTHROPIC_BASE_URL=`base_url`, Read as its only tool (the fake
    upstream calls the first tool it is offered; `tools=""`: none), and `session_id` as its
    session id (what it sends as X-Claude-Code-Session-Id), a new session or (`resume`) the
    one saved under `home`; under strace, as for `codex_exec`."""
    env = {**CLAUDE_ENV, "ANTHROPIC_BASE_URL": base_url,
           "CLAUDE_CONFIG_DIR": str(home / ".claude")}
    argv = [str(cli("claude")), "-p", "--model", model, f"--tools={tools}",
            "--resume" if resume else "--session-id", session_id, prompt]
    return _run(argv, home, env, timeout, trace)
