"""A refused call's status per client: 403, or 400 for the agent CLIs that misread a 403."""

from __future__ import annotations

import httpx
import pytest
from conftest import Proxy, assert_openai_error, chat_body, new_id

from budgetproxy.proxy.refusal import refusal_status

CODEX = "codex_exec/0.171.0 (Debian 12.0.0; x86_64) xterm (codex_exec; 0.171.0)"
CLAUDE = "claude-cli/2.1.197 (external, sdk-cli)"
RESPONSES = {"model": "m1", "input": "hi", "stream": True}
MESSAGES = {"model": "m1", "max_tokens": 16, "stream": True,
            "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize(("agent", "status"), [
    (CODEX, 400), ("codex_cli_rs/0.171.0", 400), ("Codex Desktop/1.0", 400), (CLAUDE, 400),
    ("OpenAI/Python 2.0", 403), ("Anthropic/Python 0.60", 403), ("", 403),
    ("curl/8 codex_exec", 403),
])
def test_status_by_user_agent(agent: str, status: int) -> None:
    assert refusal_status({b"user-agent": agent.encode()}) == status


def test_no_user_agent_gets_403() -> None:
    assert refusal_status({}) == 403


def spend(p: Proxy, eid: str) -> None:
    r = p.http().post("/v1/chat/completions", json=chat_body(),
                      headers={"X-Episode-Id": eid, "X-Episode-Budget": "1"})
    assert r.status_code == 200, r.text


def test_codex_gets_400_with_the_same_error_on_responses(default_proxy: Proxy) -> None:
    eid = new_id()
    spend(default_proxy, eid)
    headers = {"X-Episode-Id": eid, "User-Agent": CODEX}
    r = default_proxy.http().post("/v1/responses", json=RESPONSES, headers=headers)
    err = assert_openai_error(r, 400, "turn_budget_exhausted", None)
    assert err["type"] == "budget_exhausted"
    assert f"Episode {eid!r} has used its turn budget of 1" in err["message"]
    assert r.headers["x-episode-id"] == eid
    # Any other client keeps the contract's 403, on the same route and episode.
    other = default_proxy.http().post("/v1/responses", json=RESPONSES,
                                      headers={"X-Episode-Id": eid})
    assert_openai_error(other, 403, "turn_budget_exhausted", None)
    statuses = [t["http_status"] for t in default_proxy.wait_records(
        2, type="turn", episode_id=eid, status="rejected")]
    assert statuses == [400, 403]


def test_claude_code_gets_an_anthropic_400_on_messages(default_proxy: Proxy) -> None:
    eid = new_id()
    spend(default_proxy, eid)
    r = default_proxy.http().post("/v1/messages", json=MESSAGES,
                                  headers={"X-Episode-Id": eid, "User-Agent": CLAUDE})
    assert r.status_code == 400, r.text
    assert r.headers["x-should-retry"] == "false"
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error", body
    assert f"Episode {eid!r} has used its turn budget of 1" in body["error"]["message"]


def test_a_finished_episode_refuses_codex_with_400(default_proxy: Proxy) -> None:
    eid = new_id()
    spend(default_proxy, eid)
    http: httpx.Client = default_proxy.http()
    assert http.post(f"/v1/episodes/{eid}/end").status_code == 200
    r = http.post("/v1/responses", json=RESPONSES, headers={"X-Episode-Id": eid,
                                                            "User-Agent": CODEX})
    assert_openai_error(r, 400, "episode_finished")
    r = http.post("/v1/responses", json=RESPONSES, headers={"X-Episode-Id": eid})
    assert_openai_error(r, 403, "episode_finished")
