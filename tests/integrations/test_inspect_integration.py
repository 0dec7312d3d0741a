"""The inspect-ai integration, end to end: the real `inspect eval` CLI, the hooks loaded from
the package's entry point, the real proxy and the fake upstream, then `budgetproxy analyze`."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from conftest import ProxyFactory, WatchedUpstream, read_jsonl
from inspect_runs import ROOT, inspect_eval, require_inspect

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

EXAMPLES = ROOT / "examples"
HERE = Path(__file__).resolve().parent
WORDS = ("ox", "cat", "lemon", "avocado")
# The fake upstream echoes the last message: a word of n letters is said at turn n + 1.
SAID_AT = {w: len(w) + 1 for w in WORDS}
PROBE = "Please say 'hello, world'"


@pytest.fixture(scope="module", autouse=True)
def _inspect_installed() -> None:
    require_inspect()


def _records(log_dir: Path, kind: str) -> list[dict[str, Any]]:
    return [r for r in read_jsonl(log_dir) if r["type"] == kind]


def _analyze(log_dir: Path, *args: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "budgetproxy", "analyze", str(log_dir),
                           "--json", *args], capture_output=True, text=True, check=True,
                          cwd=ROOT)
    out: dict[str, Any] = json.loads(done.stdout)
    return out


def _text(messages: Any) -> str:
    return json.dumps(messages)


def test_an_eval_with_epochs_gives_pass_at_k_t_from_analyze(
    proxy: ProxyFactory, upstream: WatchedUpstream, tmp_path: Path
) -> None:
    """Each sample x epoch is an episode named by the eval, sample and epoch, with the sample
    id as task id and the score as its outcome; samples run concurrently and each call lands
    in its own sample's episode; inspect's capability probe (it probes reasoning models)
    spends no turn; `analyze` gives Pass@(K,T) with K up to the epochs."""
    p = proxy({}, fresh=True)
    run = inspect_eval("inspect_task.py", EXAMPLES, p.url, tmp_path, "--epochs", "2",
                       "--max-samples", "8", model="openai/o4-mini")
    assert run.returncode == 0, run.output
    log = run.log
    assert log.status == "success", run.output
    assert log.eval.model_base_url == f"{p.url}/v1"
    eval_id = log.eval.eval_id
    samples = log.samples or []
    assert len(samples) == 8 and all(s.error is None for s in samples)

    p.wait_records(8, timeout=10, type="episode")  # (written off the path, as samples end)
    episodes = {r["episode_id"]: r for r in _records(p.log_dir, "episode")}
    assert set(episodes) == {f"{eval_id}:{w}:{e}" for w in WORDS for e in (1, 2)}
    for eid, ep in episodes.items():
        word = eid.split(":")[1]
        assert ep["task_id"] == word and ep["group"] == eval_id
        assert (ep["budget"], ep["max_turns"], ep["disclosure"]) == (8, 8, "hidden")
        assert (ep["outcome"], ep["reward"], ep["end_reason"]) == ("success", 1.0, "success")
        assert ep["turns_used"] == ep["success_turn"] == SAID_AT[word]
        assert ep["tags"]["inspect_eval_id"] == eval_id
    # Every turn holds its own sample's conversation, whatever ran beside it.
    turns = _records(p.log_dir, "turn")
    assert Counter(t["episode_id"] for t in turns) == {
        eid: SAID_AT[eid.split(":")[1]] for eid in episodes}
    for t in turns:
        word = t["episode_id"].split(":")[1]
        assert t["status"] == "ok" and t["route"] == "/v1/responses"
        if t["turn"] > 1:
            assert f"starts with '{word[: t['turn'] - 1]}'" in _text(t["request_messages"])
        for other in WORDS:
            if other != word and len(other) > 2:
                assert f"'{other[:3]}" not in _text(t["request_messages"])
    # The probe reached the model, outside every episode.
    probes = [r for r in upstream.requests if r.path == "/v1/responses"
              and isinstance(r.json, dict) and r.json.get("input") == PROBE]
    assert probes and not any(PROBE in _text(t["request_messages"]) for t in turns)

    result = _analyze(p.log_dir, "--k", "1,2", "--turns", "2,3,4,6,8")
    cells = {(c["k"], c["turns"]): c for c in result["pass_at"]}
    for k in (1, 2):
        assert [cells[(k, t)]["value"] for t in (2, 3, 4, 6, 8)] == [0.0, 0.25, 0.5, 0.75, 1.0]
        assert all(cells[(k, t)]["n_tasks"] == 4 for t in (2, 3, 4, 6, 8))
    tiers = {(c["k"], c["tier"]): c["value"] for c in _analyze(
        p.log_dir, "--k", "2", "--tiers", "25,50,100")["pass_at"]}
    assert tiers == {(2, "25%"): 0.0, (2, "50%"): 0.5, (2, "100%"): 1.0}


def test_a_spent_budget_stops_the_sample_as_a_limit_before_the_proxy_refuses(
    proxy: ProxyFactory, tmp_path: Path
) -> None:
    """With `--metadata budgetproxy_budget=4` (reject mode), samples that need more turns stop
    as inspect's turn limit, are scored, and their failures reported; the proxy never had to
    refuse a call."""
    p = proxy({}, fresh=True)
    run = inspect_eval("inspect_task.py", EXAMPLES, p.url, tmp_path, "--metadata",
                       "budgetproxy_budget=4")
    assert run.returncode == 0 and run.log.status == "success", run.output
    by_word = {str(s.id): s for s in run.log.samples or []}
    for word in ("lemon", "avocado"):
        sample = by_word[word]
        assert sample.error is None and sample.limit is not None
        assert sample.limit.type == "turn" and sample.limit.limit == 4
        assert sample.scores is not None and sample.scores["includes"].value == "I"
    assert by_word["ox"].limit is None and by_word["cat"].limit is None

    p.wait_records(4, timeout=10, type="episode")  # (written off the path, as samples end)
    episodes = {r["task_id"]: r for r in _records(p.log_dir, "episode")}
    assert {w: (e["budget"], e["end_reason"], e["turns_used"]) for w, e in episodes.items()} == {
        "ox": (4, "success", 3), "cat": (4, "success", 4), "lemon": (4, "exhausted", 4),
        "avocado": (4, "exhausted", 4)}
    assert episodes["lemon"]["outcome"] == "failure" and episodes["lemon"]["reward"] == 0.0
    assert {t["status"] for t in _records(p.log_dir, "turn")} == {"ok"}


@pytest.mark.parametrize("agent", ["react_agent", "basic_agent_task"])
def test_inspect_agents_stop_cleanly_in_finish_mode(
    proxy: ProxyFactory, tmp_path: Path, agent: str
) -> None:
    """inspect's react agent and basic agent urge the model on whenever it answers without a
    tool call. With the budget spent in finish mode the agent gets the proxy's final reply
    once, then the integration ends the sample as a turn limit: scored, no error, and no
    call the proxy refuses as `episode_finished`."""
    p = proxy({"budget": {"on_exhausted": "finish"}}, fresh=True)
    run = inspect_eval(f"inspect_agents.py@{agent}", HERE, p.url, tmp_path, "--metadata",
                       "budgetproxy_budget=2")
    assert run.returncode == 0 and run.log.status == "success", run.output
    [sample] = run.log.samples or []
    assert sample.error is None, sample.error
    assert sample.limit is not None and sample.limit.type == "turn"
    assert sample.scores is not None
    p.wait_records(1, timeout=10, type="episode")  # (written off the path, after its turns)
    turns = _records(p.log_dir, "turn")
    assert [(t["turn"], t["status"]) for t in turns] == [(1, "ok"), (2, "ok"), (3, "synthetic")]
    assert "Turn budget exhausted" in turns[2]["response"]["content"]
    [episode] = _records(p.log_dir, "episode")
    assert (episode["outcome"], episode["end_reason"]) == ("failure", "exhausted")
