"""The episode API: implicit creation from headers, POST/GET, outcomes, ends, idle timeout."""

from __future__ import annotations

import time
from typing import Any

import httpx
import openai
import pytest
from conftest import Proxy, ProxyFactory, assert_openai_error, chat_body, new_id

from budgetproxy.testing import FakeUpstream


def call(p: Proxy, eid: str, text: str = "x", **headers: str) -> httpx.Response:
    with p.http() as http:
        return http.post("/v1/chat/completions", json=chat_body(text),
                         headers={"X-Episode-Id": eid, **headers})


def post(p: Proxy, path: str, body: Any = None, **kw: Any) -> httpx.Response:
    with p.http() as http:
        return http.post(path, json=body, **kw)


def get(p: Proxy, path: str) -> httpx.Response:
    with p.http() as http:
        return http.get(path)


# -- implicit creation -----------------------------------------------------------------------


def test_headers_on_the_first_call_create_the_episode(default_proxy: Proxy) -> None:
    eid = new_id()
    first = {
        "X-Episode-Budget": "3", "X-Episode-Max-Turns": "12", "X-Episode-Task": "task-7",
        "X-Episode-Group": "grp-1", "X-Episode-Disclosure": "disclosed",
        "X-Episode-Announced-Budget": "5",
    }
    r = call(default_proxy, eid, **first)
    assert r.status_code == 200 and r.headers["x-episode-budget"] == "3"
    ep = default_proxy.episode(eid)
    assert {k: ep[k] for k in ("budget", "max_turns", "tier", "task_id", "group", "disclosure",
                               "turns_used", "remaining", "status")} == {
        "budget": 3, "max_turns": 12, "tier": "25%", "task_id": "task-7", "group": "grp-1",
        "disclosure": "disclosed", "turns_used": 1, "remaining": 2, "status": "active",
    }
    # Later calls resend different headers (SDK default headers): ignored.
    later = {"X-Episode-Budget": "9", "X-Episode-Max-Turns": "40", "X-Episode-Task": "other",
             "X-Episode-Group": "g2", "X-Episode-Disclosure": "hidden",
             "X-Episode-Announced-Budget": "not-even-a-number"}
    r = call(default_proxy, eid, "y", **later)
    assert r.status_code == 200 and r.headers["x-episode-budget"] == "3"
    ep = default_proxy.episode(eid)
    assert (ep["budget"], ep["max_turns"], ep["task_id"], ep["group"], ep["disclosure"]) == (
        3, 12, "task-7", "grp-1", "disclosed")
    assert ep["turns_used"] == 2


def test_default_budget_applies_without_headers(default_proxy: Proxy) -> None:
    eid = new_id()
    call(default_proxy, eid)
    ep = default_proxy.episode(eid)
    assert (ep["budget"], ep["max_turns"], ep["tier"], ep["disclosure"]) == (20, None, "n/a",
                                                                            "hidden")


def test_max_turns_alone_is_the_budget(default_proxy: Proxy) -> None:
    eid = new_id()
    call(default_proxy, eid, **{"X-Episode-Max-Turns": "8"})
    ep = default_proxy.episode(eid)
    assert (ep["budget"], ep["max_turns"], ep["tier"]) == (8, 8, "100%")


@pytest.mark.parametrize(
    ("headers", "param"),
    [
        ({"X-Episode-Budget": "abc"}, "budget"),
        ({"X-Episode-Budget": "0"}, "budget"),
        ({"X-Episode-Budget": "-2"}, "budget"),
        ({"X-Episode-Budget": "30", "X-Episode-Max-Turns": "20"}, "budget"),
        ({"X-Episode-Max-Turns": "1.5"}, "max_turns"),
        ({"X-Episode-Announced-Budget": "0"}, "announced_budget"),
        ({"X-Episode-Disclosure": "maybe"}, "disclosure"),
    ],
)
def test_bad_episode_headers_are_400_and_create_nothing(
    default_proxy: Proxy, upstream: FakeUpstream, headers: dict[str, str], param: str
) -> None:
    eid = new_id()
    before = len(upstream.requests)
    assert_openai_error(call(default_proxy, eid, **headers), 400, "invalid_request", param)
    assert len(upstream.requests) == before
    assert get(default_proxy, f"/v1/episodes/{eid}").status_code == 404


def test_a_bad_header_value_is_quoted_as_the_client_wrote_it(default_proxy: Proxy) -> None:
    r = default_proxy.http().post("/v1/chat/completions", json={
        "model": "m1", "messages": [{"role": "user", "content": "x"}]}, headers={
        "X-Episode-Id": new_id(), "X-Episode-Budget": "³".encode()})  # type: ignore[dict-item]
    err = assert_openai_error(r, 400, "invalid_request", "budget")
    assert "got '³'" in err["message"], err


# -- POST /v1/episodes ----------------------------------------------------------------------


def test_create_episode_shape_and_base_url(default_proxy: Proxy) -> None:
    eid = new_id()
    r = post(default_proxy, "/v1/episodes", {
        "episode_id": eid, "budget": 5, "max_turns": 20, "task_id": "t1", "group": "g1",
        "disclosure": "disclosed", "announced_budget": 6, "tags": {"run": "a", "k": 2}})
    assert r.status_code == 201, r.text
    body = r.json()
    assert {k: body[k] for k in ("episode_id", "budget", "max_turns", "tier", "disclosure",
                                 "announced_budget", "base_url")} == {
        "episode_id": eid, "budget": 5, "max_turns": 20, "tier": "25%",
        "disclosure": "disclosed", "announced_budget": 6,
        "base_url": f"{default_proxy.url}/episodes/{eid}/v1",
    }
    # the rest is what GET answers, so a harness can keep one shape
    created_only = ("base_url", "api_key")
    assert {k: v for k, v in body.items() if k not in created_only} == default_proxy.episode(eid)
    assert body["tags"] == {"run": "a", "k": 2} and body["status"] == "active"
    client = default_proxy.client(base_url=body["base_url"])
    raw = client.chat.completions.with_raw_response.create(
        model="m1", messages=[{"role": "user", "content": "via base_url"}])
    assert raw.headers["x-episode-id"] == eid and raw.headers["x-episode-remaining"] == "4"
    ep = default_proxy.episode(eid)
    assert ep["turns_used"] == 1 and ep["task_id"] == "t1" and ep["group"] == "g1"


def test_create_without_id_generates_one(default_proxy: Proxy) -> None:
    r = post(default_proxy, "/v1/episodes", {})
    assert r.status_code == 201
    body = r.json()
    assert body["budget"] == 20 and body["tier"] == "n/a" and body["disclosure"] == "hidden"
    assert body["base_url"].endswith(f"/episodes/{body['episode_id']}/v1")
    assert default_proxy.episode(body["episode_id"])["turns_used"] == 0


def test_create_existing_id_is_409(default_proxy: Proxy) -> None:
    eid = new_id()
    assert post(default_proxy, "/v1/episodes", {"episode_id": eid}).status_code == 201
    assert_openai_error(post(default_proxy, "/v1/episodes", {"episode_id": eid}), 409,
                        "episode_exists")
    implicit = new_id()
    call(default_proxy, implicit)
    assert_openai_error(post(default_proxy, "/v1/episodes", {"episode_id": implicit}), 409,
                        "episode_exists")


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"budget": "five"}, "budget"),
        ({"budget": 0}, "budget"),
        ({"budget": 2.5}, "budget"),
        ({"budget": True}, "budget"),
        ({"max_turns": -1}, "max_turns"),
        ({"budget": 25, "max_turns": 20}, "budget"),
        ({"announced_budget": 0}, "announced_budget"),
        ({"disclosure": "maybe"}, "disclosure"),
        ({"tags": ["a"]}, "tags"),
        ({"task_id": 7}, "task_id"),
        ({"bogus": 1}, "bogus"),
    ],
)
def test_create_bad_fields_are_400_naming_the_param(
    default_proxy: Proxy, body: dict[str, Any], param: str
) -> None:
    eid = new_id()
    r = post(default_proxy, "/v1/episodes", {"episode_id": eid, **body})
    assert_openai_error(r, 400, "invalid_request", param)
    assert get(default_proxy, f"/v1/episodes/{eid}").status_code == 404


@pytest.mark.parametrize("bad", ["has space", "x" * 129, "a/b", ".", ".."])
def test_create_bad_id_is_400(default_proxy: Proxy, bad: str) -> None:
    assert_openai_error(post(default_proxy, "/v1/episodes", {"episode_id": bad}), 400,
                        "invalid_episode_id")


@pytest.mark.parametrize("raw", [b"{not json", b"[1]", b'"x"', b"null"])
def test_create_bad_body_is_400(default_proxy: Proxy, raw: bytes) -> None:
    r = post(default_proxy, "/v1/episodes", content=raw,
             headers={"content-type": "application/json"})
    assert_openai_error(r, 400, "invalid_request")


# -- GET ------------------------------------------------------------------------------------

GET_FIELDS = {"episode_id", "task_id", "group", "budget", "max_turns", "tier", "disclosure",
              "turns_used", "remaining", "status", "outcome", "exhausted", "end_reason"}


def test_get_shape_and_404(default_proxy: Proxy) -> None:
    eid = new_id()
    post(default_proxy, "/v1/episodes", {"episode_id": eid, "budget": 2, "max_turns": 4,
                                         "task_id": "t", "group": "g"})
    call(default_proxy, eid)
    ep = default_proxy.episode(eid)
    assert GET_FIELDS <= set(ep)
    assert {k: ep[k] for k in GET_FIELDS} == {
        "episode_id": eid, "task_id": "t", "group": "g", "budget": 2, "max_turns": 4,
        "tier": "50%", "disclosure": "hidden", "turns_used": 1, "remaining": 1,
        "status": "active", "outcome": None, "exhausted": False, "end_reason": None,
    }
    assert_openai_error(get(default_proxy, f"/v1/episodes/{new_id()}"), 404, "episode_not_found")


# -- outcome and end ------------------------------------------------------------------------


def test_outcome_same_twice_200_different_409(default_proxy: Proxy) -> None:
    eid = new_id()
    call(default_proxy, eid)
    call(default_proxy, eid, "again")
    report = {"success": True, "reward": 1.0, "metadata": {"note": "solved"}}
    r1 = post(default_proxy, f"/v1/episodes/{eid}/outcome", report)
    assert r1.status_code == 200
    ep = default_proxy.episode(eid)
    assert (ep["status"], ep["outcome"], ep["end_reason"], ep["success_turn"]) == (
        "finished", "success", "success", 2)  # success_turn defaults to turns used
    assert post(default_proxy, f"/v1/episodes/{eid}/outcome", report).status_code == 200
    assert_openai_error(post(default_proxy, f"/v1/episodes/{eid}/outcome", {"success": False}),
                        409, "outcome_conflict")
    assert_openai_error(
        post(default_proxy, f"/v1/episodes/{eid}/outcome", {"success": True, "reward": 0.5}),
        409, "outcome_conflict")
    assert default_proxy.episode(eid)["outcome"] == "success"


def test_outcome_success_turn_and_unknown(default_proxy: Proxy) -> None:
    eid = new_id()
    for i in range(3):
        call(default_proxy, eid, f"t{i}")
    r = post(default_proxy, f"/v1/episodes/{eid}/outcome", {"success": True, "success_turn": 2})
    assert r.status_code == 200
    assert default_proxy.episode(eid)["success_turn"] == 2
    assert_openai_error(post(default_proxy, f"/v1/episodes/{new_id()}/outcome",
                             {"success": True}), 404, "episode_not_found")
    assert_openai_error(post(default_proxy, f"/v1/episodes/{new_id()}/end"), 404,
                        "episode_not_found")


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"success": "yes"}, "success"),
        ({"success": 1}, "success"),
        ({}, "success"),
        ({"success": True, "reward": "high"}, "reward"),
        ({"success": True, "success_turn": "3"}, "success_turn"),
        ({"success": True, "success_turn": 0}, "success_turn"),
        ({"success": True, "metadata": []}, "metadata"),
    ],
)
def test_outcome_wrong_types_are_400(
    default_proxy: Proxy, body: dict[str, Any], param: str
) -> None:
    eid = new_id()
    call(default_proxy, eid)
    assert_openai_error(post(default_proxy, f"/v1/episodes/{eid}/outcome", body), 400,
                        "invalid_request", param)
    assert default_proxy.episode(eid)["status"] == "active"


def test_end_without_report_is_abandoned_and_idempotent(default_proxy: Proxy) -> None:
    eid = new_id()
    call(default_proxy, eid)
    assert post(default_proxy, f"/v1/episodes/{eid}/end").status_code == 200
    ep = default_proxy.episode(eid)
    assert (ep["status"], ep["outcome"], ep["end_reason"]) == ("finished", None, "abandoned")
    assert post(default_proxy, f"/v1/episodes/{eid}/end").status_code == 200


def test_call_on_a_finished_episode_is_403(default_proxy: Proxy, upstream: FakeUpstream) -> None:
    eid = new_id()
    call(default_proxy, eid)
    post(default_proxy, f"/v1/episodes/{eid}/outcome", {"success": False})
    before = len(upstream.requests)
    r = call(default_proxy, eid, "after the end")
    assert_openai_error(r, 403, "episode_finished")
    with pytest.raises(openai.PermissionDeniedError):
        default_proxy.client(max_retries=3).chat.completions.create(
            model="m1", messages=[{"role": "user", "content": "x"}],
            extra_headers={"X-Episode-Id": eid})
    assert len(upstream.requests) == before


# -- end reasons ----------------------------------------------------------------------------


def exhaust(p: Proxy, eid: str, budget: int) -> None:
    for i in range(budget):
        assert call(p, eid, f"turn {i}", **{"X-Episode-Budget": str(budget)}).status_code == 200


@pytest.mark.parametrize(
    ("spend", "refuse", "how", "reason"),
    [
        ("all", False, {"success": True}, "success"),
        ("all", True, {"success": True}, "success"),
        ("all", False, {"success": False}, "exhausted"),
        ("all", True, {"success": False}, "exhausted"),
        ("all", True, None, "exhausted"),
        ("some", False, {"success": False}, "failure"),
        ("some", False, None, "abandoned"),
        ("none", False, None, "abandoned"),
    ],
)
def test_end_reason_precedence(
    default_proxy: Proxy, spend: str, refuse: bool, how: dict[str, Any] | None, reason: str
) -> None:
    eid = new_id()
    budget = 2
    if spend == "all":
        exhaust(default_proxy, eid, budget)
    elif spend == "some":
        call(default_proxy, eid, **{"X-Episode-Budget": str(budget)})
    else:
        post(default_proxy, "/v1/episodes", {"episode_id": eid, "budget": budget})
    if refuse:
        assert call(default_proxy, eid, "one too many").status_code == 403
    path = f"/v1/episodes/{eid}/" + ("end" if how is None else "outcome")
    assert post(default_proxy, path, how).status_code == 200
    ep = default_proxy.episode(eid)
    assert ep["end_reason"] == reason
    assert ep["exhausted"] == (spend == "all")
    rec = default_proxy.wait_records(type="episode", episode_id=eid)
    assert len(rec) == 1 and rec[0]["end_reason"] == reason


# -- idle timeout and retention -------------------------------------------------------------


@pytest.fixture(scope="module")
def idle(proxy: ProxyFactory) -> Proxy:
    return proxy({"episodes": {"idle_timeout_s": 1.0, "sweep_interval_s": 0.1,
                               "retention_s": 1.0}})


def wait_for(predicate: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.05)


def test_idle_episode_ends_abandoned(idle: Proxy, upstream: FakeUpstream) -> None:
    eid = new_id()
    assert call(idle, eid).status_code == 200
    assert idle.episode(eid)["status"] == "active"
    t0 = time.monotonic()
    wait_for(lambda: idle.episode(eid)["status"] == "finished")
    assert time.monotonic() - t0 >= 0.5
    ep = idle.episode(eid)
    assert ep["end_reason"] == "abandoned" and ep["outcome"] is None
    assert idle.wait_records(type="episode", episode_id=eid)[0]["end_reason"] == "abandoned"
    before = len(upstream.requests)
    assert_openai_error(call(idle, eid), 403, "episode_finished")
    assert len(upstream.requests) == before


def test_activity_keeps_an_episode_alive(idle: Proxy) -> None:
    eid = new_id()
    for i in range(12):  # 1.8 s of calls with gaps well under the 1 s idle timeout
        assert call(idle, eid, f"keepalive {i}").status_code == 200
        time.sleep(0.15)
    assert idle.episode(eid)["status"] == "active"


def test_finished_episode_past_retention_is_still_refused(idle: Proxy) -> None:
    eid = new_id()
    call(idle, eid)
    post(idle, f"/v1/episodes/{eid}/outcome", {"success": True})

    def forgotten() -> bool:
        body = get(idle, f"/v1/episodes/{eid}").json()
        return "budget" not in body

    wait_for(forgotten)
    assert get(idle, f"/v1/episodes/{eid}").json()["status"] == "finished"
    assert_openai_error(call(idle, eid, "late"), 403, "episode_finished")
    assert_openai_error(post(idle, "/v1/episodes", {"episode_id": eid}), 409, "episode_exists")
    r = post(idle, f"/v1/episodes/{eid}/outcome", {"success": True})
    assert r.status_code in (200, 409)
