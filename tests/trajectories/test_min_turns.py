"""X-Episode-Min-Turns (and POST /v1/episodes min_turns): read on the first call, held by the
episode, written in its record for `analyze --ceiling`, never enforced."""

from __future__ import annotations

from conftest import Proxy, ProxyFactory, new_id

from budgetproxy.testing import FakeUpstream


def _proxy(proxy: ProxyFactory, upstream: FakeUpstream) -> Proxy:
    return proxy({"upstreams": [{"name": "main", "base_url": upstream.base_url}]})


def test_min_turns_header_round_trip(proxy: ProxyFactory, upstream: FakeUpstream) -> None:
    p = _proxy(proxy, upstream)
    eid = new_id()
    first = p.client(default_headers={"X-Episode-Id": eid, "X-Episode-Task": "lake-1",
                                      "X-Episode-Max-Turns": "10", "X-Episode-Min-Turns": "6"})
    first.chat.completions.create(model="m1", messages=[{"role": "user", "content": "go"}])
    assert p.episode(eid)["min_turns"] == 6
    # a later call's copy is ignored (first-call header), and the answer says so
    later = p.client(default_headers={"X-Episode-Id": eid, "X-Episode-Min-Turns": "2"})
    raw = later.chat.completions.with_raw_response.create(
        model="m1", messages=[{"role": "user", "content": "again"}])
    assert "X-Episode-Min-Turns '2' ignored" in raw.headers["x-episode-warning"]
    # the same value again is no warning
    same = p.client(default_headers={"X-Episode-Id": eid, "X-Episode-Min-Turns": "06"})
    raw = same.chat.completions.with_raw_response.create(
        model="m1", messages=[{"role": "user", "content": "once more"}])
    assert "x-episode-warning" not in raw.headers
    # more turns than min_turns are not refused: the minimum is recorded, never enforced
    assert p.episode(eid)["turns_used"] == 3 and p.episode(eid)["min_turns"] == 6
    assert p.http().post(f"/v1/episodes/{eid}/outcome", json={"success": True}).status_code == 200
    (rec,) = p.wait_records(1, type="episode", episode_id=eid)
    assert rec["min_turns"] == 6 and rec["task_id"] == "lake-1"


def test_min_turns_absent_is_null(proxy: ProxyFactory, upstream: FakeUpstream) -> None:
    p = _proxy(proxy, upstream)
    eid = new_id()
    p.client(default_headers={"X-Episode-Id": eid}).chat.completions.create(
        model="m1", messages=[{"role": "user", "content": "go"}])
    assert p.episode(eid)["min_turns"] is None
    p.http().post(f"/v1/episodes/{eid}/end")
    (rec,) = p.wait_records(1, type="episode", episode_id=eid)
    assert rec["min_turns"] is None


def test_min_turns_on_the_episode_api(proxy: ProxyFactory, upstream: FakeUpstream) -> None:
    p = _proxy(proxy, upstream)
    eid = new_id()
    r = p.http().post("/v1/episodes", json={"episode_id": eid, "task_id": "t", "min_turns": 5,
                                            "max_turns": 8})
    assert r.status_code == 201, r.text
    assert r.json()["min_turns"] == 5
    p.http().post(f"/v1/episodes/{eid}/outcome", json={"success": False})
    (rec,) = p.wait_records(1, type="episode", episode_id=eid)
    assert rec["min_turns"] == 5
    bad = p.http().post("/v1/episodes", json={"min_turns": 0})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "min_turns"


def test_bad_min_turns_header_is_400(proxy: ProxyFactory, upstream: FakeUpstream) -> None:
    p = _proxy(proxy, upstream)
    r = p.http().post("/v1/chat/completions", json={"model": "m1", "messages": [
        {"role": "user", "content": "go"}]},
                      headers={"X-Episode-Id": new_id(), "X-Episode-Min-Turns": "-3"})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "min_turns"
    assert r.headers["x-should-retry"] == "false"
