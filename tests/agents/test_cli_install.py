"""The agent tests install the pinned CLIs themselves, and fail (never skip) with the one
command to run when they cannot: the README's test command needs no step it leaves out."""

from __future__ import annotations

import json
import shutil
import stat
from pathlib import Path

import pytest
from agent_clis import INSTALL, NODE, STRACE_INSTALL, ensure_clis, missing_clis

# A stand-in for npm: `npm ci --prefix DIR ...` installs what DIR/package.json pins (and
# notes that it ran), without the network.
FAKE_NPM = """#!/usr/bin/env python3
import json, pathlib, sys
node = pathlib.Path(sys.argv[sys.argv.index("--prefix") + 1])
(node / "npm-ran").write_text(" ".join(sys.argv[1:]))
commands = {"@openai/codex": "codex", "@anthropic-ai/claude-code": "claude"}
for package, version in json.loads((node / "package.json").read_text())["dependencies"].items():
    home = node / "node_modules" / package
    home.mkdir(parents=True, exist_ok=True)
    (home / "package.json").write_text(json.dumps({"name": package, "version": version}))
    bin_dir = node / "node_modules" / ".bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / commands[package]).write_text("#!/bin/sh\\n")
"""


@pytest.fixture
def node(tmp_path: Path) -> Path:
    """A copy of .ci/node's pins with nothing installed."""
    out = tmp_path / "node"
    out.mkdir()
    shutil.copy(NODE / "package.json", out / "package.json")
    return out


def _npm(tmp_path: Path) -> str:
    npm = tmp_path / "bin" / "npm"
    npm.parent.mkdir()
    npm.write_text(FAKE_NPM)
    npm.chmod(npm.stat().st_mode | stat.S_IXUSR)
    return str(npm)


def test_missing_clis_are_installed_with_npm_ci(node: Path, tmp_path: Path) -> None:
    npm = _npm(tmp_path)
    assert len(missing_clis(node)) == 2
    ensure_clis(node, which={"npm": npm, "strace": "/usr/bin/strace"}.get)
    assert missing_clis(node) == []
    assert (node / "npm-ran").read_text().startswith(f"ci --prefix {node} --no-audit")
    (node / "npm-ran").unlink()
    ensure_clis(node, which={"npm": npm, "strace": "/usr/bin/strace"}.get)
    assert not (node / "npm-ran").exists()  # installed: npm is not run again


def test_a_pin_that_changed_is_installed_again(node: Path, tmp_path: Path) -> None:
    npm = _npm(tmp_path)
    ensure_clis(node, which={"npm": npm, "strace": "/usr/bin/strace"}.get)
    pins = json.loads((node / "package.json").read_text())
    pins["dependencies"]["@openai/codex"] = "0.0.1"
    (node / "package.json").write_text(json.dumps(pins))
    assert missing_clis(node) == ["@openai/codex@0.0.1"]
    ensure_clis(node, which={"npm": npm, "strace": "/usr/bin/strace"}.get)
    assert missing_clis(node) == []


def test_without_npm_the_tests_fail_with_the_command_to_run(node: Path) -> None:
    with pytest.raises(pytest.fail.Exception) as failed:
        ensure_clis(node, which={"strace": "/usr/bin/strace"}.get)
    message = str(failed.value)
    assert INSTALL in message and "npm is not on PATH" in message
    assert INSTALL.startswith("npm ci --prefix .ci/node")


def test_without_strace_the_tests_fail_with_the_command_to_run(node: Path, tmp_path: Path) -> None:
    with pytest.raises(pytest.fail.Exception) as failed:
        ensure_clis(node, which={"npm": _npm(tmp_path)}.get)
    assert STRACE_INSTALL in str(failed.value)


def test_the_readme_and_ci_run_the_same_test_command() -> None:
    root = NODE.parents[1]
    readme = (root / "README.md").read_text()
    command = "pip install -e '.[dev]' -c constraints.txt && python -m pytest"
    assert command in readme
    ci = (root / ".ci" / "run").read_text()
    assert "python -m pip install -q -e '.[dev]' -c constraints.txt" in ci
    assert "python -m pytest" in ci
    # the tests install the CLIs, as they do for a README reader: no install step of its own
    assert not [ln for ln in ci.splitlines() if "npm ci" in ln and not ln.lstrip().startswith("#")]
    for prerequisite in ("Node.js", "npm", "strace", "Redis", "prometheus", "nginx"):
        assert prerequisite in readme, prerequisite
