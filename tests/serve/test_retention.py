"""Bounded retention through the real server: episodes.max_retained evicts the oldest finished
episodes, counted in a metric, and an evicted id keeps refusing calls; serve --check states the
memory the retention implies."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import httpx
from redis_support import REDIS_URL, require_redis

from tests.conftest import ProxyFactory, eventually, new_id


def test_an_evicted_episode_stays_finished_and_is_counted(proxy: ProxyFactory) -> None:
    p = proxy({"episodes": {"max_retained": 2, "sweep_interval_s": 0.05},
               "metrics": {"enabled": True}})
    c = p.client()
    ids = [new_id("ret") for _ in range(3)]
    for eid in ids:
        c.chat.completions.create(model="m1", messages=[{"role": "user", "content": "hi"}],
                                  extra_headers={"X-Episode-Id": eid, "X-Episode-Budget": "5"})
        r = p.http().post(f"/v1/episodes/{eid}/outcome", json={"success": True})
        assert r.status_code == 200, r.text
    # evicted: only its id is left, which says it finished
    assert p.http().get(f"/v1/episodes/{ids[0]}").json() == {"episode_id": ids[0],
                                                             "status": "finished"}
    assert p.episode(ids[2])["status"] == "finished"
    r = p.http().post("/v1/chat/completions", headers={"X-Episode-Id": ids[0]},
                      json={"model": "m1", "messages": [{"role": "user", "content": "again"}]})
    assert r.status_code == 403 and r.json()["error"]["code"] == "episode_finished"
    metrics = ""
    for _ in range(100):  # the sweep counts evictions in the metric
        metrics = httpx.get(p.url + "/metrics").text
        if "budgetproxy_retained_evictions_total 1.0" in metrics:
            break
    assert "budgetproxy_retained_evictions_total 1.0" in metrics


def test_check_states_the_memory_the_retention_implies(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("episodes: {retention_s: 3600, max_retained: 50000}\n"
                   "upstreams: [{base_url: 'http://127.0.0.1:9/v1'}]\n")
    done = subprocess.run([sys.executable, "-m", "budgetproxy", "serve", "--config", str(cfg),
                           "--check", "--episode-rate", "20"], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert ("at 20 finished episodes/s the memory store keeps 50,000 finished episodes "
            "(episodes.retention_s 3600 s, capped by episodes.max_retained (50,000)), at most "
            "48.8 MiB at 1024 bytes each") in done.stderr


def test_an_outcome_for_an_evicted_episode_is_refused_not_dropped(proxy: ProxyFactory) -> None:
    """An evicted episode's id is all that is left of it: a report can no longer be recorded
    (nor compared with the one it ended with), and saying 200 would lose it unseen. Ending it
    again is still answered as an ended episode."""
    p = proxy({"episodes": {"max_retained": 1, "sweep_interval_s": 0.05}})
    c = p.client()
    ids = [new_id("gone") for _ in range(2)]
    for eid in ids:
        c.chat.completions.create(model="m1", messages=[{"role": "user", "content": "hi"}],
                                  extra_headers={"X-Episode-Id": eid, "X-Episode-Budget": "5"})
    assert p.http().post(f"/v1/episodes/{ids[0]}/end").status_code == 200  # no report
    r = p.http().post(f"/v1/episodes/{ids[1]}/outcome", json={"success": True})
    assert r.status_code == 200, r.text  # the second to end: the first is evicted
    assert p.http().get(f"/v1/episodes/{ids[0]}").json() == {"episode_id": ids[0],
                                                             "status": "finished"}
    r = p.http().post(f"/v1/episodes/{ids[0]}/outcome", json={"success": True})
    assert r.status_code == 409, r.text
    assert r.json()["error"]["code"] == "episode_forgotten"
    assert "retention" in r.json()["error"]["message"]
    r = p.http().post(f"/v1/episodes/{ids[0]}/end")
    assert r.status_code == 200 and r.json() == {"episode_id": ids[0], "status": "finished"}
    # a retained one still answers the same report again as it did
    r = p.http().post(f"/v1/episodes/{ids[1]}/outcome", json={"success": True})
    assert r.status_code == 200 and r.json()["outcome"] == "success"


def test_an_outcome_for_an_episode_past_retention_in_redis_is_refused(
        proxy: ProxyFactory) -> None:
    """The Redis store keeps a finished episode for retention_s, then only its id: a report
    then is refused as on the memory store."""
    require_redis()
    p = proxy({"episodes": {"retention_s": 0.3, "sweep_interval_s": 0.05},
               "store": {"kind": "redis", "url": REDIS_URL,
                         "key_prefix": f"ret-{uuid.uuid4().hex[:8]}"}})
    eid = new_id("gone-r")
    p.client().chat.completions.create(
        model="m1", messages=[{"role": "user", "content": "hi"}],
        extra_headers={"X-Episode-Id": eid, "X-Episode-Budget": "5"})
    assert p.http().post(f"/v1/episodes/{eid}/end").status_code == 200
    eventually(lambda: p.http().get(f"/v1/episodes/{eid}").json(),
               lambda view: view == {"episode_id": eid, "status": "finished"})
    r = p.http().post(f"/v1/episodes/{eid}/outcome", json={"success": True})
    assert r.status_code == 409 and r.json()["error"]["code"] == "episode_forgotten", r.text
