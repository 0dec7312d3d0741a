"""The examples run against the real proxy (examples/proxy.yaml) and the simulated model."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import read_jsonl

from budgetproxy.analysis.passk import budgetmix_candidates
from budgetproxy.config import load_config
from budgetproxy.demo.frozenlake import TASKS
from budgetproxy.demo.model_server import ModelServer
from budgetproxy.serve.server import ProxyServer

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
TASK = {t.task_id: t for t in TASKS}


@dataclass
class Stack:
    url: str
    log_dir: Path

    def episodes(self, harness: str, n: int = 1, timeout: float = 10.0) -> list[dict[str, Any]]:
        """Episode records of one example's harness, once at least n are on disk."""
        deadline = time.monotonic() + timeout
        while True:
            found = [r for r in read_jsonl(self.log_dir) if r["type"] == "episode"
                     and (r.get("tags") or {}).get("harness") == harness]
            if len(found) >= n or time.monotonic() > deadline:
                return found
            time.sleep(0.05)

    def turns(self, episode_id: str) -> list[dict[str, Any]]:
        return [r for r in read_jsonl(self.log_dir)
                if r["type"] == "turn" and r["episode_id"] == episode_id]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    log_dir = tmp_path_factory.mktemp("examples-traj")
    with ModelServer(seed=0) as model:
        config = load_config(
            EXAMPLES / "proxy.yaml",
            {"trajectories": {"dir": str(log_dir)}},
            environ={"UPSTREAM_URL": model.base_url},
        )
        with ProxyServer(config) as proxy:
            yield Stack(proxy.url, log_dir)


def run_example(stack: Stack, script: str, *args: str) -> str:
    env = {**os.environ, "BUDGETPROXY_URL": stack.url}
    env.pop("OPENAI_BASE_URL", None)
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args],
        capture_output=True, text=True, timeout=90, env=env, cwd=EXAMPLES.parent,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return done.stdout


def test_openai_harness_example(stack: Stack) -> None:
    out = run_example(stack, "openai_harness.py", "--task", "4x4", "--budget", "8")
    assert "8 of 16 turns (50%), hidden" in out
    (episode,) = stack.episodes("openai-sdk")
    assert episode["task_id"] == "4x4" and episode["budget"] == 8
    assert episode["outcome"] in ("success", "failure")
    assert len(stack.turns(episode["episode_id"])) == episode["turns_used"] >= 1


def test_openai_harness_example_runs_out_of_budget(stack: Stack) -> None:
    out = run_example(stack, "openai_harness.py", "--task", "8x8-slippery", "--budget", "2",
                      "--model", "sim-recovering", "--disclosure", "disclosed")
    assert "the proxy refused the next turn" in out
    assert "end reason exhausted" in out


def test_rl_rollout_group_example_shares_one_budgetmix_budget(stack: Stack) -> None:
    out = run_example(stack, "rl_rollout_group.py", "--k", "6", "--group", "g-test")
    assert "group g-test on 4x4-slippery" in out
    episodes = stack.episodes("rl-rollout", n=6)
    assert len(episodes) == 6
    budgets = {e["budget"] for e in episodes}
    assert len(budgets) == 1
    assert budgets <= set(budgetmix_candidates(TASK["4x4-slippery"].max_turns))
    assert {e["disclosure"] for e in episodes} == {"disclosed"}
    assert all(e["reward"] in (0.0, 1.0) and "advantage" in e["metadata"] for e in episodes)
    turns = stack.turns(episodes[0]["episode_id"])
    assert turns and all(" remain" in (t["disclosure"]["text"] or "") for t in turns
                         if t["status"] == "ok")


def test_grpo_loop_example(stack: Stack, tmp_path: Path) -> None:
    out = run_example(stack, "grpo_loop.py", "--k", "3", "--steps", "1", "--tasks",
                      "4x4-slippery", "--logs", str(stack.log_dir), "--out", str(tmp_path))
    assert "done=True" in out and "policy-gradient weight" in out
    rows = [line for line in out.splitlines() if line.startswith("  ep-")]
    assert len(rows) == 3
    advantages = [float(line.split(" advantage ")[1].split()[0]) for line in rows]
    # GRPO: rewards minus the group mean; each is printed to 3 decimals (±0.0005 apiece)
    assert abs(sum(advantages)) <= 0.0005 * len(advantages) + 1e-9
    assert "episodes -> " in out and (tmp_path / "episodes.parquet").is_file()
    episodes = stack.episodes("grpo-loop", n=3)
    assert len({e["budget"] for e in episodes}) == 1  # one BudgetMix budget for the group


def test_agents_sdk_example(stack: Stack) -> None:
    pytest.importorskip("agents", reason="openai-agents is not installed")
    out = run_example(stack, "agents_sdk.py", "--task", "4x4", "--budget", "12")
    assert "12 of 16 turns (75%)" in out
    (episode,) = stack.episodes("openai-agents")
    assert episode["outcome"] in ("success", "failure")
    assert len(stack.turns(episode["episode_id"])) >= 1


def test_agents_sdk_example_stops_on_a_spent_budget(stack: Stack) -> None:
    pytest.importorskip("agents", reason="openai-agents is not installed")
    out = run_example(stack, "agents_sdk.py", "--task", "8x8", "--budget", "3")
    assert "the proxy refused the next turn" in out
    assert "end reason exhausted" in out


def test_langchain_example(stack: Stack) -> None:
    pytest.importorskip("langchain_openai", reason="langchain-openai is not installed")
    out = run_example(stack, "langchain_agent.py", "--task", "8x8", "--budget", "3")
    assert "3 of 48 turns" in out
    (episode,) = stack.episodes("langchain")
    assert episode["turns_used"] == 3 and episode["end_reason"] in ("exhausted", "success")
    assert "the proxy refused the next turn" in out or episode["end_reason"] == "success"
