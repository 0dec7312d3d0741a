"""Input checks found by trying the proxy as a new user: ids, outcome values, URLs, routes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import Proxy, ProxyFactory, assert_openai_error, chat_body, new_id

from budgetproxy.config import ConfigError, load_config


def test_create_episode_without_a_body(default_proxy: Proxy) -> None:
    r = default_proxy.http().post("/v1/episodes")
    assert r.status_code == 201, r.text
    assert r.json()["episode_id"].startswith("ep-")


@pytest.mark.parametrize("route", ["get", "outcome", "end"])
def test_episode_routes_reject_bad_ids(default_proxy: Proxy, route: str) -> None:
    http = default_proxy.http()
    if route == "get":
        r = http.get("/v1/episodes/bad%20id")
    elif route == "outcome":
        r = http.post("/v1/episodes/bad%20id/outcome", json={"success": True})
    else:
        r = http.post("/v1/episodes/bad%20id/end")
    assert_openai_error(r, 400, "invalid_episode_id", "episode_id")


def test_malformed_json_names_no_param(default_proxy: Proxy) -> None:
    r = default_proxy.http().post(
        "/v1/episodes", content=b'{"budget":', headers={"content-type": "application/json"}
    )
    assert_openai_error(r, 400, "invalid_request", None)


def test_success_turn_past_the_turns_used_is_refused(default_proxy: Proxy) -> None:
    eid = new_id()
    http = default_proxy.http()
    http.post("/v1/chat/completions", json=chat_body("one"), headers={"X-Episode-Id": eid})
    r = http.post(f"/v1/episodes/{eid}/outcome", json={"success": True, "success_turn": 9})
    assert_openai_error(r, 400, "invalid_request", "success_turn")
    assert default_proxy.episode(eid)["status"] == "active"  # nothing was recorded
    ok = http.post(f"/v1/episodes/{eid}/outcome", json={"success": True, "success_turn": 1})
    assert ok.status_code == 200 and ok.json()["success_turn"] == 1


def test_nan_reward_is_refused(default_proxy: Proxy) -> None:
    eid = new_id()
    http = default_proxy.http()
    http.post("/v1/episodes", json={"episode_id": eid})
    r = http.post(
        f"/v1/episodes/{eid}/outcome",
        content=b'{"success": false, "reward": NaN}',
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "invalid_request"


def test_same_body_on_another_route_is_a_new_turn(proxy: ProxyFactory) -> None:
    p = proxy({"budget": {"free_retries_per_turn": 5}})
    eid = new_id()
    http = p.http()
    body = {"model": "m1", "prompt": "same bytes", "messages": [{"role": "user", "content": "x"}]}
    h = {"X-Episode-Id": eid}
    a = http.post("/v1/chat/completions", json=body, headers=h)
    b = http.post("/v1/completions", json=body, headers=h)
    assert (a.status_code, b.status_code) == (200, 200)
    assert (a.headers["x-episode-turn"], b.headers["x-episode-turn"]) == ("1", "2")
    again = http.post("/v1/completions", json=body, headers=h)  # a real resend: free
    assert again.headers["x-episode-turn"] == "2"
    assert p.episode(eid)["turns_used"] == 2


def test_upstream_without_api_path_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"upstreams\.0\.base_url: needs the API path.*/v1"):
        load_config(None, {"upstreams": [{"base_url": "http://127.0.0.1:8001"}]})
    out = subprocess.run(
        [sys.executable, "-m", "budgetproxy", "serve", "--upstream", "http://127.0.0.1:8001",
         "--log-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=30,
    )
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "http://127.0.0.1:8001/v1" in out.stderr


def test_unset_env_var_is_named(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text('upstreams: [{base_url: "${BP_TEST_SURELY_UNSET}"}]\n')
    with pytest.raises(ConfigError, match="unset environment variable: BP_TEST_SURELY_UNSET"):
        load_config(cfg, environ={})


def test_client_hanging_up_after_done_is_a_complete_turn(default_proxy: Proxy) -> None:
    """Agents close the stream once they have [DONE]; that turn was answered in full."""
    import httpx

    eid = new_id()
    body = chat_body("stream and hang up", stream=True)
    with httpx.Client(base_url=default_proxy.url, timeout=10) as c, c.stream(
        "POST", "/v1/chat/completions", json=body,
        headers={"X-Episode-Id": eid, "X-Fake-Tail-Ms": "600"},
    ) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line == "data: [DONE]":
                break  # leave while the upstream still holds the connection
    rec = default_proxy.wait_records(type="turn", episode_id=eid, timeout=8)
    assert [(x["status"], x["http_status"], x["charged"]) for x in rec] == [("ok", 200, True)]
    assert rec[0]["response"]["content"] == "echo: stream and hang up"
