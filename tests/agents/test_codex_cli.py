"""Codex CLI end to end: `codex exec` through the proxy's path-prefix base_url (Responses API,
streaming) to the fake upstream, its budget spent mid-run in finish and reject mode."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest
from agent_clis import codex_exec, connections, ensure_clis, proxy_address
from conftest import Proxy, ProxyFactory, new_id

from budgetproxy.config import FinishTexts
from budgetproxy.testing import FakeUpstream

EXHAUSTED_TEXT = FinishTexts().turns

TURN_1_OF_1 = "[Turn budget] Turn 1 of 1. 0 turns remain after this one."


@pytest.fixture(scope="module", autouse=True)
def clis_installed() -> None:
    """The pinned CLIs, installed with npm when missing (a failure naming the command to run
    when npm is not there)."""
    ensure_clis()


@pytest.fixture(scope="module")
def finishing(proxy: ProxyFactory) -> Proxy:
    return proxy({"budget": {"on_exhausted": "finish"}})


@pytest.fixture(scope="module")
def rejecting(proxy: ProxyFactory) -> Proxy:
    return proxy({"budget": {"on_exhausted": "reject"}})


def open_episode(p: Proxy, budget: int) -> tuple[str, str]:
    """A disclosed episode made through the episode API, and its path-prefix base URL."""
    r = p.http().post("/v1/episodes", json={"episode_id": new_id("codex"), "budget": budget,
                                            "disclosure": "disclosed"})
    assert r.status_code == 201, r.text
    made: dict[str, Any] = r.json()
    return made["episode_id"], made["base_url"]


def sent_upstream(upstream: FakeUpstream, marker: str) -> list[dict[str, Any]]:
    """The Responses requests the upstream received whose input names `marker`."""
    return [r.json for r in upstream.requests
            if r.path == "/v1/responses" and marker.encode() in r.body]


def test_finish_mode_ends_the_run_with_the_synthetic_reply(
    finishing: Proxy, upstream: FakeUpstream, tmp_path: Path
) -> None:
    eid, base_url = open_episode(finishing, budget=1)
    assert base_url.endswith(f"/episodes/{eid}/v1")
    trace = tmp_path / "connect.log"
    run = codex_exec(base_url, tmp_path, f"Look around, then stop ({eid}).", trace=trace)
    assert run.returncode == 0, run.output
    assert EXHAUSTED_TEXT in run.stdout, run.output
    # Offline: the proxy is the only address it connected to (no login, update or plugin sync).
    assert connections(trace) == {proxy_address(finishing)}
    # Turn 1 went upstream and came back with a tool call; Codex ran it and asked again, and
    # the spent budget answered that second call itself.
    turns = finishing.wait_records(2, type="turn", episode_id=eid)
    assert [(t["turn"], t["status"], t["http_status"]) for t in turns] == [
        (1, "ok", 200), (2, "synthetic", 200)]
    assert turns[0]["disclosure"] == {"arm": "disclosed", "text": TURN_1_OF_1}
    sent = sent_upstream(upstream, eid)
    assert len(sent) == 1, [s["input"][-1] for s in sent]
    assert sent[0]["stream"] is True
    # The disclosure text is in the newest input item, the one the model reads last.
    assert TURN_1_OF_1 in str(sent[0]["input"][-1]), sent[0]["input"][-1]
    ep = finishing.episode(eid)
    assert (ep["turns_used"], ep["exhausted"]) == (1, True)


def test_reject_mode_stops_at_once_with_the_budget_message(
    rejecting: Proxy, upstream: FakeUpstream, tmp_path: Path
) -> None:
    eid, base_url = open_episode(rejecting, budget=1)
    run = codex_exec(base_url, tmp_path, f"Look around, then stop ({eid}).")
    assert run.returncode == 1, run.output
    assert "Reconnecting" not in run.output, run.output
    assert f"Episode '{eid}' has used its turn budget of 1" in run.stderr, run.output
    assert "turn_budget_exhausted" in run.stderr
    assert run.seconds < 20, run.seconds
    rejected = rejecting.wait_records(1, type="turn", episode_id=eid, status="rejected")
    time.sleep(0.3)  # a reconnect would have been logged by now
    assert rejected == rejecting.records(type="turn", episode_id=eid, status="rejected")
    assert [r["http_status"] for r in rejected] == [400]
    assert len(sent_upstream(upstream, eid)) == 1


def test_a_finished_episode_stops_codex_at_once(
    rejecting: Proxy, upstream: FakeUpstream, tmp_path: Path
) -> None:
    eid, base_url = open_episode(rejecting, budget=5)
    assert rejecting.http().post(f"/v1/episodes/{eid}/outcome",
                                 json={"success": True}).status_code == 200
    run = codex_exec(base_url, tmp_path, f"Anything ({eid}).")
    assert run.returncode == 1, run.output
    assert "Reconnecting" not in run.output, run.output
    assert f"Episode '{eid}' has finished" in run.stderr, run.output
    assert sent_upstream(upstream, eid) == []


def test_the_codex_preset_makes_each_codex_session_an_episode(
    proxy: ProxyFactory, upstream: FakeUpstream, tmp_path: Path
) -> None:
    p = proxy({"episodes": {"id_header_presets": ["codex"]}, "disclosure": {"mode": "disclosed"},
               "budget": {"on_exhausted": "finish", "default_turns": 1}})
    marker = new_id("codex-session")
    run = codex_exec(p.base_url, tmp_path, f"Look around, then stop ({marker}).")
    assert run.returncode == 0, run.output
    assert EXHAUSTED_TEXT in run.stdout, run.output
    found = re.search(r"^session id: (\S+)$", run.stderr, re.MULTILINE)
    assert found is not None, run.stderr
    sid = found.group(1)
    turns = p.wait_records(2, type="turn", episode_id=sid)
    assert [(t["turn"], t["status"]) for t in turns] == [(1, "ok"), (2, "synthetic")]
    sent = sent_upstream(upstream, marker)
    assert len(sent) == 1 and TURN_1_OF_1 in str(sent[0]["input"][-1])
