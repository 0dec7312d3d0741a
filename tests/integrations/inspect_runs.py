"""Running the real `inspect eval` CLI against a proxy, with the budgetproxy hooks loaded the
way inspect loads them: from the `inspect_ai` entry point the package declares."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
INSTALL = "pip install -e '.[dev]' -c constraints.txt"
HOOKS_MODULE = "budgetproxy.integrations.inspect_hooks"


def require_inspect() -> None:
    """inspect-ai comes with the dev extra: a failure (never a skip) naming the command."""
    if importlib.util.find_spec("inspect_ai") is None:
        pytest.fail(f"inspect-ai is not installed: run {INSTALL}", pytrace=False)


def declared_entry_point() -> str:
    """The `inspect_ai` entry point pyproject.toml declares for budgetproxy."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    value: str = project["entry-points"]["inspect_ai"]["budgetproxy"]
    return value


def entry_point_dir(tmp: Path) -> Path | None:
    """A directory to put on the inspect process's path so that it finds the entry point,
    when the installed budgetproxy does not declare it yet (a checkout installed before the
    integration existed, until `pip install -e .` is run again); None when it is installed.
    The distribution made here holds nothing but pyproject's own entry point."""
    value = declared_entry_point()
    assert value == HOOKS_MODULE
    installed = importlib.metadata.entry_points(group="inspect_ai")
    if any(ep.name == "budgetproxy" and ep.value == value for ep in installed):
        return None
    dist = tmp / "entry-point" / "budgetproxy_entry_point-0.dist-info"
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: budgetproxy-entry-point\nVersion: 0\n")
    (dist / "entry_points.txt").write_text(f"[inspect_ai]\nbudgetproxy = {value}\n")
    return dist.parent


@dataclass
class EvalRun:
    returncode: int
    output: str
    log: Any  # inspect_ai.log.EvalLog


def inspect_eval(task: str, cwd: Path, proxy_url: str, tmp: Path, *args: str,
                 model: str = "openai/m1", timeout: float = 240.0) -> EvalRun:
    """`inspect eval TASK --model MODEL --model-base-url PROXY/v1 ARGS` with BUDGETPROXY_URL
    set, and its log."""
    from inspect_ai.log import list_eval_logs, read_eval_log

    log_dir = tmp / "inspect-logs"
    path = [str(ROOT)]
    extra = entry_point_dir(tmp)
    if extra is not None:
        path.append(str(extra))
    env = {**os.environ, "BUDGETPROXY_URL": proxy_url, "OPENAI_API_KEY": "sk-client-0000",
           "INSPECT_LOG_DIR": str(log_dir), "PYTHONPATH": os.pathsep.join(path),
           "INSPECT_DISPLAY": "plain", "NO_COLOR": "1"}
    env.pop("OPENAI_BASE_URL", None)
    done = subprocess.run(
        [sys.executable, "-m", "inspect_ai", "eval", task, "--model", model,
         "--model-base-url", f"{proxy_url}/v1", *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    output = done.stdout + done.stderr
    logs = list_eval_logs(str(log_dir))
    assert len(logs) == 1, output  # a fresh `tmp` for each run
    return EvalRun(done.returncode, output, read_eval_log(logs[0]))
