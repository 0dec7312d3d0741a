"""Claude Code end to end: `claude -p` through the proxy (ANTHROPIC_BASE_URL, the
X-Claude-Code-Session-Id alias) to the fake upstream's Messages API, its budget spent mid-run
in finish and reject mode."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from agent_clis import claude_print, connections, ensure_clis, proxy_address
from conftest import Proxy, ProxyFactory, new_id, unmarked

from budgetproxy.config import FinishTexts
from budgetproxy.core.fingerprint import canonical
from budgetproxy.testing import FakeUpstream

EXHAUSTED_TEXT = FinishTexts().turns

TURN_1_OF_1 = "[Turn budget] Turn 1 of 1. 0 turns remain after this one."
ALIAS = {"id_headers": ["X-Claude-Code-Session-Id"]}


@pytest.fixture(scope="module", autouse=True)
def clis_installed() -> None:
    """The pinned CLIs, installed with npm when missing (a failure naming the command to run
    when npm is not there)."""
    ensure_clis()


@pytest.fixture(scope="module")
def finishing(proxy: ProxyFactory) -> Proxy:
    return proxy({"episodes": ALIAS, "budget": {"on_exhausted": "finish"}})


@pytest.fixture(scope="module")
def rejecting(proxy: ProxyFactory) -> Proxy:
    # The same alias by its preset name.
    return proxy({"episodes": {"id_header_presets": ["claude_code"]},
                  "budget": {"on_exhausted": "reject"}})


def open_episode(p: Proxy, budget: int, episode_id: str) -> None:
    r = p.http().post("/v1/episodes", json={"episode_id": episode_id, "budget": budget,
                                            "disclosure": "disclosed"})
    assert r.status_code == 201, r.text


def sent_upstream(upstream: FakeUpstream, marker: str) -> list[dict[str, Any]]:
    """The Messages requests the upstream received whose messages name `marker`."""
    return [r.json for r in upstream.requests
            if r.path == "/v1/messages" and marker.encode() in r.body]


@pytest.mark.parametrize("named_by", ["alias", "path"])
def test_finish_mode_ends_the_run_with_the_synthetic_reply(
    finishing: Proxy, upstream: FakeUpstream, tmp_path: Path, named_by: str
) -> None:
    # The episode is the session id (the alias header), or the path prefix's id, which wins
    # over the alias header Claude Code still sends.
    sid = str(uuid.uuid4())
    eid = sid if named_by == "alias" else new_id("claude")
    open_episode(finishing, 1, eid)
    base_url = finishing.url if named_by == "alias" else f"{finishing.url}/episodes/{eid}"
    trace = tmp_path / "connect.log"
    run = claude_print(base_url, tmp_path, f"Read a file, then stop ({eid}).", session_id=sid,
                       trace=trace)
    assert run.returncode == 0, run.output
    assert EXHAUSTED_TEXT in run.stdout, run.output
    # Offline: the proxy is the only address it connected to (no telemetry, reports, updates).
    assert connections(trace) == {proxy_address(finishing)}
    # Turn 1 went upstream and came back with a tool_use; Claude Code ran the tool and asked
    # again, and the spent budget answered that second call itself.
    turns = finishing.wait_records(2, type="turn", episode_id=eid)
    assert [(t["turn"], t["status"], t["http_status"]) for t in turns] == [
        (1, "ok", 200), (2, "synthetic", 200)]
    assert turns[0]["disclosure"] == {"arm": "disclosed", "text": TURN_1_OF_1}
    sent = sent_upstream(upstream, eid)
    assert len(sent) == 1, len(sent)
    assert sent[0]["stream"] is True
    # The disclosure text is in the last user message, the one the model reads last.
    last = sent[0]["messages"][-1]
    assert last["role"] == "user" and TURN_1_OF_1 in str(last["content"]), last
    ep = finishing.episode(eid)
    assert (ep["turns_used"], ep["exhausted"]) == (1, True)


def test_reject_mode_stops_at_once_saying_the_budget_is_spent(
    rejecting: Proxy, upstream: FakeUpstream, tmp_path: Path
) -> None:
    sid = str(uuid.uuid4())
    open_episode(rejecting, 1, sid)
    run = claude_print(rejecting.url, tmp_path, f"Read a file, then stop ({sid}).",
                       session_id=sid)
    assert run.returncode == 1, run.output
    assert f"Episode '{sid}' has used its turn budget of 1" in run.stdout, run.output
    assert "authenticate" not in run.output.lower(), run.output
    assert run.seconds < 20, run.seconds
    rejected = rejecting.wait_records(1, type="turn", episode_id=sid, status="rejected")
    time.sleep(0.3)  # a retry would have been logged by now
    assert rejected == rejecting.records(type="turn", episode_id=sid, status="rejected")
    assert [r["http_status"] for r in rejected] == [400]
    assert len(sent_upstream(upstream, sid)) == 1


def test_a_resumed_and_compacted_session_keeps_its_texts_and_an_append_only_prompt(
    rejecting: Proxy, upstream: FakeUpstream, tmp_path: Path
) -> None:
    """Several prompts in one session (each `claude -p --resume`), then /compact, then more:
    every upstream prompt extends the one before it (cache markers and content shapes aside)
    until the compaction rewrites the history, no earlier turn's text is dropped, and the
    compaction call is free (claude_code preset, episodes.compaction: free) and untold."""
    sid = str(uuid.uuid4())
    open_episode(rejecting, 10, sid)
    prompts = ["first prompt", "second prompt", "third prompt", "/compact", "after compact"]
    for i, prompt in enumerate(prompts):
        run = claude_print(rejecting.url, tmp_path, prompt, session_id=sid, tools="",
                           resume=i > 0, timeout=120)
        assert run.returncode == 0, run.output
    mine = sent_upstream(upstream, sid)  # (its metadata names the session)
    assert len(mine) == 5, len(mine)
    flat = [canonical(unmarked(r["messages"])) for r in mine]
    told = [f"Turn {t} of 10." for t in range(1, 5)]
    breaks = [t for t in (1, 2) if flat[t][: len(flat[t - 1])] != flat[t - 1]]
    assert breaks == [], f"append-only broken before turns {[t + 1 for t in breaks]}"
    # (the fake upstream echoes the prompt: its replies hold the texts too)
    asked = str([m for m in flat[2] if m["role"] == "user"])
    dropped = [t + 1 for t in range(3) if asked.count(told[t]) != 1]
    assert dropped == [], f"texts of turns {dropped} dropped from the third prompt"
    assert "[Turn budget]" not in str(mine[3]["messages"][-1])  # the compaction: untold
    assert told[3] in str(mine[4]["messages"][-1])  # after it: turn 4, on the summary
    assert rejecting.episode(sid)["turns_used"] == 4
    (rec,) = rejecting.wait_records(1, type="compaction", episode_id=sid)
    assert rec["charged"] is False and rec["http_status"] == 200
