"""The group API: sizes, members, rewards after the budget rule, advantages, the long poll."""

from __future__ import annotations

import statistics
import threading
import time
from typing import Any

import httpx
import pytest
from conftest import Proxy, ProxyFactory, assert_openai_error, chat_body, new_id


def call(p: Proxy, eid: str, text: str = "hello", **headers: str) -> httpx.Response:
    return p.http().post("/v1/chat/completions", json=chat_body(text),
                         headers={"X-Episode-Id": eid, **headers})


def outcome(p: Proxy, eid: str, success: bool, reward: float | None = None) -> None:
    body: dict[str, Any] = {"success": success}
    if reward is not None:
        body["reward"] = reward
    r = p.http().post(f"/v1/episodes/{eid}/outcome", json=body)
    assert r.status_code == 200, r.text


def group(p: Proxy, task: str, name: str, **params: Any) -> httpx.Response:
    return p.http().get(f"/v1/groups/{task}/{name}", params=params, timeout=30)


def test_declare_group_size(default_proxy: Proxy) -> None:
    task = new_id("task")
    http = default_proxy.http()
    r = http.post("/v1/groups", json={"task_id": task, "group": "g", "size": 4})
    assert r.status_code == 201, r.text
    assert r.json() == {"task_id": task, "group": "g", "size": 4, "done": False,
                        "finished": 0, "episodes": []}
    assert http.post("/v1/groups", json={"task_id": task, "group": "g", "size": 4}
                     ).status_code == 200
    assert_openai_error(http.post("/v1/groups", json={"task_id": task, "group": "g",
                                                      "size": 5}), 409, "group_conflict", "size")
    assert_openai_error(http.post("/v1/groups", json={"task_id": task, "group": "g",
                                                      "size": 0}), 400, "invalid_request")
    assert_openai_error(group(default_proxy, task, "nope"), 404, "group_not_found", "group")


def test_group_from_headers_with_advantages(default_proxy: Proxy) -> None:
    task, p = new_id("task"), default_proxy
    ids = [new_id() for _ in range(3)]
    for eid in ids:
        r = call(p, eid, **{"X-Episode-Task": task, "X-Episode-Group": "g1",
                            "X-Episode-Group-Size": "3"})
        assert r.status_code == 200
    view = group(p, task, "g1").json()
    assert view["size"] == 3 and view["done"] is False
    assert [e["episode_id"] for e in view["episodes"]] == ids
    assert all(e["status"] == "active" and e["advantage"] is None for e in view["episodes"])
    outcome(p, ids[0], True, 1.0)
    outcome(p, ids[1], False)  # no reward reported: 0.0
    assert group(p, task, "g1").json()["done"] is False
    outcome(p, ids[2], True)  # success, no reward: 1.0
    view = group(p, task, "g1").json()
    assert view["done"] is True
    rewards = [e["reward"] for e in view["episodes"]]
    assert rewards == [1.0, 0.0, 1.0]
    mean = statistics.fmean(rewards)
    assert [e["advantage"] for e in view["episodes"]] == pytest.approx(
        [r - mean for r in rewards])
    assert {e["end_reason"] for e in view["episodes"]} == {"success", "failure"}
    assert all(e["budget"] == 20 and e["disclosure"] == "hidden" for e in view["episodes"])


def test_bad_group_size_header(default_proxy: Proxy) -> None:
    r = call(default_proxy, new_id(), **{"X-Episode-Task": "t", "X-Episode-Group": "g",
                                         "X-Episode-Group-Size": "0"})
    assert_openai_error(r, 400, "invalid_request", "group_size")


@pytest.mark.parametrize("rule", ["zero", "keep"])
def test_exhausted_rollouts_reward_rule(proxy: ProxyFactory, rule: str) -> None:
    p = proxy({"reward": {"on_exhausted": rule, "scale_by_std": True}})
    task = new_id("task")
    spent, fine = new_id(), new_id()
    head = {"X-Episode-Task": task, "X-Episode-Group": "g", "X-Episode-Group-Size": "2",
            "X-Episode-Budget": "1"}
    assert call(p, spent, **head).status_code == 200
    assert call(p, spent, "again").status_code == 403  # refused: the budget is spent
    outcome(p, spent, False, 0.5)
    assert call(p, fine, **head).status_code == 200
    outcome(p, fine, True, 1.0)
    view = group(p, task, "g").json()
    by_id = {e["episode_id"]: e for e in view["episodes"]}
    assert by_id[spent]["end_reason"] == "exhausted"
    want = 0.0 if rule == "zero" else 0.5
    assert by_id[spent]["reward"] == want and by_id[fine]["reward"] == 1.0
    rewards = [want, 1.0]
    mean, std = statistics.fmean(rewards), statistics.stdev(rewards)
    assert by_id[spent]["advantage"] == pytest.approx((want - mean) / (std + 1e-6))


def test_long_poll_wakes_on_last_episode(default_proxy: Proxy) -> None:
    p, task = default_proxy, new_id("task")
    ids = [new_id() for _ in range(2)]
    for eid in ids:
        assert call(p, eid, **{"X-Episode-Task": task, "X-Episode-Group": "g",
                               "X-Episode-Group-Size": "2"}).status_code == 200
    outcome(p, ids[0], True)
    got: dict[str, Any] = {}

    def poll() -> None:
        with httpx.Client(base_url=p.url, timeout=30) as c:
            r = c.get(f"/v1/groups/{task}/g", params={"wait": "true", "timeout_s": 20})
            got["view"], got["at"] = r.json(), time.monotonic()

    t = threading.Thread(target=poll)
    t.start()
    time.sleep(0.5)
    assert "view" not in got  # still waiting
    ended_at = time.monotonic()
    outcome(p, ids[1], False)
    t.join(10)
    assert got["view"]["done"] is True
    assert got["at"] - ended_at < 3.0, got["at"] - ended_at  # woken, not the 20 s timeout


def test_long_poll_times_out(default_proxy: Proxy) -> None:
    p, task = default_proxy, new_id("task")
    p.http().post("/v1/groups", json={"task_id": task, "group": "g", "size": 2})
    t0 = time.monotonic()
    r = group(p, task, "g", wait="true", timeout_s=0.3)
    assert r.status_code == 200 and r.json()["done"] is False
    assert 0.3 <= time.monotonic() - t0 < 2
    assert_openai_error(group(p, task, "g", wait="true", timeout_s=-1), 400, "invalid_request")


def test_groups_and_trajectories_stay_in_their_tenant(proxy: ProxyFactory) -> None:
    p = proxy({"auth": {"keys": [{"key": "sk-tenant-a-0000000", "tenant": "a"},
                                 {"key": "sk-tenant-b-0000000", "tenant": "b"}]}})
    a = {"authorization": "Bearer sk-tenant-a-0000000"}
    b = {"authorization": "Bearer sk-tenant-b-0000000"}
    task, eid = new_id("task"), new_id()
    r = p.http().post("/v1/chat/completions", json=chat_body(),
                      headers={**a, "X-Episode-Id": eid, "X-Episode-Task": task,
                               "X-Episode-Group": "g", "X-Episode-Group-Size": "1"})
    assert r.status_code == 200, r.text
    assert p.http().post(f"/v1/episodes/{eid}/end", headers=a).status_code == 200
    view = p.http().get(f"/v1/groups/{task}/g", headers=a).json()
    assert view["task_id"] == task and view["done"] is True
    assert [e["episode_id"] for e in view["episodes"]] == [eid]
    assert_openai_error(p.http().get(f"/v1/groups/{task}/g", headers=b), 404, "group_not_found",
                        "group")
    assert p.http().get(f"/v1/episodes/{eid}/trajectory", headers=a).json()["episode_id"] == eid
    assert_openai_error(p.http().get(f"/v1/episodes/{eid}/trajectory", headers=b), 404,
                        "episode_not_found")
