"""Ids rollout frameworks use: /rollout/{rid}/attempt/{aid}/v1 paths and per-episode keys."""

from __future__ import annotations

from conftest import Proxy, ProxyFactory, WatchedUpstream, assert_openai_error, chat_body, new_id

MESSAGES = [{"role": "user", "content": "go"}]


def test_attempt_paths_are_episodes_of_their_rollout(default_proxy: Proxy) -> None:
    p, rid = default_proxy, new_id("ro")
    for aid in ("at-1", "at-2"):
        client = p.client(base_url=f"{p.url}/rollout/{rid}/attempt/{aid}/v1")
        out = client.chat.completions.create(model="m1", messages=MESSAGES)  # type: ignore[arg-type]
        assert out.choices[0].message.content == "echo: go"
        client.chat.completions.create(model="m1", messages=[*MESSAGES, {"role": "user",
                                                                         "content": "more"}])  # type: ignore[list-item]
    ep = p.episode(f"{rid}:at-1")
    assert ep["turns_used"] == 2 and ep["task_id"] == rid and ep["group"] == rid
    view = p.http().get(f"/v1/groups/{rid}/{rid}").json()
    assert [e["episode_id"] for e in view["episodes"]] == [f"{rid}:at-1", f"{rid}:at-2"]
    # other routes under the prefix are the plain ones
    assert p.http().get(f"/rollout/{rid}/attempt/at-1/v1/models").status_code == 200
    assert p.http().get(f"/rollout/{rid}/attempt/at-1/v1/episodes/{rid}:at-1").json()[
        "turns_used"] == 2
    bad = p.http().post(f"/rollout/{rid}/attempt/a%20b/v1/chat/completions", json=chat_body())
    assert_openai_error(bad, 400, "invalid_episode_id")


def test_an_attempt_id_with_a_colon_is_refused(default_proxy: Proxy,
                                               upstream: WatchedUpstream) -> None:
    """`/rollout/r:1/attempt/a` is episode r:1:a; `/rollout/r/attempt/1:a` would be too, and
    share its budget from another rollout's group: it is refused, nothing forwarded."""
    p, rid = default_proxy, new_id("ro")
    ok = p.http().post(f"/rollout/{rid}:1/attempt/a/v1/chat/completions", json=chat_body())
    assert ok.status_code == 200 and ok.headers["x-episode-id"] == f"{rid}:1:a"
    before = len(upstream.requests)
    bad = p.http().post(f"/rollout/{rid}/attempt/1:a/v1/chat/completions", json=chat_body())
    assert_openai_error(bad, 400, "invalid_episode_id")
    messages = p.http().post(f"/rollout/{rid}/attempt/1:a/v1/messages",
                             json={"model": "m1", "max_tokens": 8, "messages": MESSAGES})
    assert messages.status_code == 400
    assert messages.json()["type"] == "error"
    assert messages.json()["error"]["type"] == "invalid_request_error"
    assert len(upstream.requests) == before
    assert p.episode(f"{rid}:1:a")["turns_used"] == 1


def test_episode_key_needs_no_other_id(proxy: ProxyFactory, upstream: WatchedUpstream) -> None:
    p = proxy({"auth": {"keys": ["sk-proxy-key-000000"]}})
    r = p.http().post("/v1/episodes", json={"budget": 2, "task_id": "t", "group": "g"},
                      headers={"authorization": "Bearer sk-proxy-key-000000"})
    assert r.status_code == 201, r.text
    created = r.json()
    eid, key = created["episode_id"], created["api_key"]
    assert key.startswith(f"bpk.{eid}.")
    client = p.client(api_key=key)  # the proxy's own key is not needed with it
    client.chat.completions.create(model="m1", messages=MESSAGES)  # type: ignore[arg-type]
    assert "bpk." not in upstream.requests[-1].headers.get("authorization", "")
    status = p.http().get(f"/v1/episodes/{eid}",
                          headers={"authorization": "Bearer sk-proxy-key-000000"}).json()
    assert status["turns_used"] == 1
    forged = key[:-4] + ("0000" if not key.endswith("0000") else "1111")
    r = p.http().post("/v1/chat/completions", json=chat_body(),
                      headers={"authorization": f"Bearer {forged}"})
    assert_openai_error(r, 401, "invalid_api_key")
    r = p.http().post("/episodes/other-episode/v1/chat/completions", json=chat_body(),
                      headers={"authorization": f"Bearer {key}"})
    assert_openai_error(r, 400, "invalid_episode_id")


def test_episode_key_on_an_open_proxy_is_not_forwarded(
    default_proxy: Proxy, upstream: WatchedUpstream
) -> None:
    key = default_proxy.http().post("/v1/episodes", json={}).json()["api_key"]
    default_proxy.http().post("/v1/chat/completions", json=chat_body("keyed"),
                              headers={"authorization": f"Bearer {key}"})
    sent = upstream.requests[-1]
    assert sent.json["messages"][0]["content"] == "keyed"
    assert "authorization" not in sent.headers


def test_attempt_paths_are_canonicalised_first(default_proxy: Proxy) -> None:
    rid = new_id("ro")
    r = default_proxy.http().post(f"/rollout/{rid}/attempt/x/../at-1/v1//chat/completions",
                                  json=chat_body())
    assert r.status_code == 200, r.text
    assert default_proxy.episode(f"{rid}:at-1")["turns_used"] == 1


def test_episode_key_of_a_tenant(proxy: ProxyFactory) -> None:
    p = proxy({"auth": {"keys": [{"key": "sk-tenant-a-0000000", "tenant": "a"}]}})
    a = {"authorization": "Bearer sk-tenant-a-0000000"}
    created = p.http().post("/v1/episodes", json={"episode_id": new_id()}, headers=a).json()
    eid, key = created["episode_id"], created["api_key"]
    assert key.startswith(f"bpk.a/{eid}.")
    r = p.http().post("/v1/chat/completions", json=chat_body(),
                      headers={"authorization": f"Bearer {key}"})
    assert r.status_code == 200, r.text
    assert p.http().get(f"/v1/episodes/{eid}", headers=a).json()["turns_used"] == 1
