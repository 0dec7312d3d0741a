"""Tenants: each key's episodes live in its tenant's namespace, on the memory and the Redis
store; another tenant's episode is a 404 on every route, the same answer as an id nobody
used; admin keys name the tenant they act for."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest
from conftest import Proxy, ProxyFactory, chat_body, eventually, new_id
from redis_support import REDIS_URL, require_redis

KEYS = [{"key": "key-a", "tenant": "team-a"}, {"key": "key-b", "tenant": "team-b"}, "key-plain"]
ADMIN = "key-admin"


@pytest.fixture(scope="module", params=["memory", "redis"])
def tenanted(request: pytest.FixtureRequest, proxy: ProxyFactory) -> Proxy:
    over: dict[str, Any] = {"auth": {"keys": KEYS, "admin_keys": [ADMIN]}}
    if request.param == "redis":
        require_redis()
        over["store"] = {"kind": "redis", "url": REDIS_URL,
                         "key_prefix": f"t17-{uuid.uuid4().hex[:8]}"}
    return proxy(over)


def _as(p: Proxy, key: str, tenant: str | None = None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {key}"}
    if tenant is not None:
        headers["X-Episode-Tenant"] = tenant
    return p.http(headers=headers)


def _turn(c: httpx.Client, eid: str, budget: int = 1) -> httpx.Response:
    return c.post("/v1/chat/completions", json=chat_body(new_id("t")),
                  headers={"X-Episode-Id": eid, "X-Episode-Budget": str(budget),
                           "X-Episode-Task": "task-secret"})


def _not_found_the_same_way(r: httpx.Response, unused: httpx.Response) -> None:
    assert r.status_code == unused.status_code == 404, (r.text, unused.text)
    assert r.json()["error"]["code"] == unused.json()["error"]["code"] == "episode_not_found"
    assert "task-secret" not in r.text


def test_another_tenants_episode_is_a_404_on_every_route(tenanted: Proxy) -> None:
    a, b = _as(tenanted, "key-a"), _as(tenanted, "key-b")
    eid, unused = new_id("mine"), new_id("unused")
    assert _turn(a, eid).status_code == 200
    for method, route, body in (("GET", "", None), ("POST", "/end", None),
                                ("POST", "/outcome", {"success": True})):
        r = b.request(method, f"/v1/episodes/{eid}{route}", json=body)
        other = b.request(method, f"/v1/episodes/{unused}{route}", json=body)
        _not_found_the_same_way(r, other)
        r = b.request(method, f"/episodes/{eid}/v1/episodes/{eid}{route}", json=body)
        assert r.status_code == 404
    ep = a.get(f"/v1/episodes/{eid}").json()
    assert ep["status"] == "active" and ep["turns_used"] == 1 and ep["tenant"] == "team-a"
    assert ep["episode_id"] == eid


def test_the_same_id_under_two_tenants_is_two_episodes(tenanted: Proxy) -> None:
    a, b, plain = _as(tenanted, "key-a"), _as(tenanted, "key-b"), _as(tenanted, "key-plain")
    eid = new_id("same")
    assert _turn(a, eid).status_code == 200
    r = _turn(a, eid)
    assert r.status_code == 403 and r.json()["error"]["code"] == "turn_budget_exhausted"
    assert eid in r.json()["error"]["message"] and "team-a" not in r.json()["error"]["message"]
    # B's turns never spend A's budget: B's own episode of that id has its own
    for _ in range(2):
        r = _turn(b, eid, budget=3)
        assert r.status_code == 200 and r.headers["x-episode-id"] == eid
    assert b.get(f"/v1/episodes/{eid}").json()["turns_used"] == 2
    assert a.get(f"/v1/episodes/{eid}").json()["turns_used"] == 1
    # the default namespace (a key without a tenant) is a third
    assert plain.get(f"/v1/episodes/{eid}").status_code == 404
    created = plain.post("/v1/episodes", json={"episode_id": eid, "budget": 2})
    assert created.status_code == 201 and "tenant" not in created.json()
    # an outcome reported by B ends B's episode only
    assert b.post(f"/v1/episodes/{eid}/outcome", json={"success": True}).status_code == 200
    assert a.get(f"/v1/episodes/{eid}").json()["status"] == "active"


def test_creating_an_id_another_tenant_holds_reveals_nothing(tenanted: Proxy) -> None:
    a, b = _as(tenanted, "key-a"), _as(tenanted, "key-b")
    eid = new_id("taken")
    assert a.post("/v1/episodes", json={"episode_id": eid}).status_code == 201
    r = b.post("/v1/episodes", json={"episode_id": eid})
    assert r.status_code == 201, r.text  # B's own, not a 409 that would say A has one
    assert r.json()["base_url"].endswith(f"/episodes/{eid}/v1")
    assert a.post("/v1/episodes", json={"episode_id": eid}).status_code == 409


def test_admin_keys_act_for_the_tenant_they_name(tenanted: Proxy) -> None:
    a = _as(tenanted, "key-a")
    eid = new_id("adm")
    assert _turn(a, eid, budget=2).status_code == 200
    ep = _as(tenanted, ADMIN, "team-a").get(f"/v1/episodes/{eid}").json()
    assert ep["turns_used"] == 1 and ep["tenant"] == "team-a"
    assert _as(tenanted, ADMIN).get(f"/v1/episodes/{eid}").status_code == 404  # default
    assert _as(tenanted, ADMIN, "team-b").get(f"/v1/episodes/{eid}").status_code == 404
    r = _as(tenanted, ADMIN, "team-a").post(f"/v1/episodes/{eid}/end")
    assert r.status_code == 200 and r.json()["status"] == "finished"
    assert a.get(f"/v1/episodes/{eid}").json()["end_reason"] == "abandoned"
    r = _as(tenanted, ADMIN, "no/slash").get(f"/v1/episodes/{eid}")
    assert r.status_code == 400 and r.json()["error"]["param"] == "tenant"
    # a tenant's key cannot name another tenant: the header is an admin's only
    r = _as(tenanted, "key-b", "team-a").get(f"/v1/episodes/{eid}")
    assert r.status_code == 404


def test_the_log_keeps_tenants_apart(tenanted: Proxy) -> None:
    eid = new_id("logged")
    assert _turn(_as(tenanted, "key-a"), eid).status_code == 200
    assert _turn(_as(tenanted, "key-b"), eid).status_code == 200
    for stored in (f"team-a/{eid}", f"team-b/{eid}"):
        (rec,) = tenanted.wait_records(1, type="turn", episode_id=stored)
        assert rec["turn"] == 1 and rec["status"] == "ok"
    assert not tenanted.records(type="turn", episode_id=eid)


def _samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    from prometheus_client.parser import text_string_to_metric_families

    return {tuple(sorted(sm.labels.items())): sm.value
            for fam in text_string_to_metric_families(text) for sm in fam.samples
            if sm.name == name}


def test_metrics_carry_the_tenant_only_for_a_configured_list(proxy: ProxyFactory) -> None:
    listed = proxy({"auth": {"keys": KEYS, "tenants": ["team-a"]}, "metrics": {"enabled": True}})
    for key in ("key-a", "key-b", "key-plain"):
        assert _turn(_as(listed, key), new_id("m")).status_code == 200
    text = eventually(  # (a turn is counted just after its answer is sent)
        lambda: listed.http().get("/metrics").text,
        lambda text: sum(_samples(text, "budgetproxy_tenant_turns_total").values()) >= 3)
    turns = _samples(text, "budgetproxy_tenant_turns_total")
    assert turns[(("tenant", "team-a"),)] == 1
    assert turns[(("tenant", "other"),)] == 1  # team-b is not in the list: no new label
    assert turns[(("tenant", "default"),)] == 1
    assert _samples(text, "budgetproxy_tenant_episodes_started_total")[
        (("tenant", "team-a"),)] == 1
    assert all("tenant" not in dict(k) for k in _samples(text, "budgetproxy_turns_total"))
    unlisted = proxy({"auth": {"keys": KEYS}, "metrics": {"enabled": True}})
    assert _turn(_as(unlisted, "key-a"), new_id("m")).status_code == 200
    assert "budgetproxy_tenant_" not in unlisted.http().get("/metrics").text
