"""GET /v1/episodes/{id}/trajectory: turns as the model saw them, with captured tokens."""

from __future__ import annotations

from typing import Any

from conftest import Proxy, ProxyFactory, WatchedUpstream, assert_openai_error, new_id

from budgetproxy.testing import fake_tokens

TEMPLATE = "[Turn budget] Turn {turn} of {total}."


def _proxy(proxy: ProxyFactory, upstream: WatchedUpstream, **extra: Any) -> Proxy:
    return proxy({"upstreams": [{"name": "main", "base_url": upstream.base_url,
                                 "capture_tokens": True}],
                  "disclosure": {"mode": "disclosed", "template": TEMPLATE}, **extra})


def _rollout(p: Proxy, eid: str, turns: int = 2) -> list[dict[str, Any]]:
    client = p.client(default_headers={"X-Fake-Token-Server": "vllm"})
    messages: list[dict[str, Any]] = [{"role": "user", "content": "begin"}]
    for i in range(turns):
        out = client.chat.completions.create(
            model="m1", messages=messages,  # type: ignore[arg-type]
            extra_headers={"X-Episode-Id": eid, "X-Episode-Budget": "4"})
        messages.append({"role": "assistant", "content": out.choices[0].message.content})
        messages.append({"role": "user", "content": f"step {i}"})
    return messages


def test_trajectory_of_a_finished_episode(proxy: ProxyFactory, upstream: WatchedUpstream) -> None:
    p = _proxy(proxy, upstream)
    eid = new_id()
    _rollout(p, eid)
    assert_openai_error(p.http().get(f"/v1/episodes/{eid}/trajectory"), 409, "episode_active")
    p.http().post(f"/v1/episodes/{eid}/outcome", json={"success": True, "reward": 0.5})
    r = p.http().get(f"/v1/episodes/{eid}/trajectory")
    assert r.status_code == 200, r.text
    data = r.json()
    assert data["episode_id"] == eid and data["reward"] == 0.5
    turns = data["turns"]
    assert [t["turn"] for t in turns] == [1, 2]
    # the messages as the model saw them: the budget text on the last message, and kept
    assert turns[0]["messages"] == [{"role": "user", "content": "begin\n\n[Turn budget] Turn 1 "
                                                                "of 4."}]
    assert turns[1]["messages"][0] == turns[0]["messages"][0]
    assert turns[1]["messages"][-1]["content"].endswith("Turn 2 of 4.")
    for t in turns:
        assert t["prompt_token_ids"] == fake_tokens.prompt_ids(t["messages"])
        assert t["completion_token_ids"] == fake_tokens.completion_ids(t["response"]["content"])
        assert t["logprobs"] == [fake_tokens.logprob(i) for i in t["completion_token_ids"]]
        assert t["usage"]["total_tokens"] > 0
    assert data["append_only"] is True
    last = turns[-1]
    assert data["token_ids"] == last["prompt_token_ids"] + last["completion_token_ids"]
    sampled = turns[0]["completion_token_ids"] + last["completion_token_ids"]
    assert [t for t, m in zip(data["token_ids"], data["loss_mask"], strict=True) if m] == sampled


def test_trajectory_errors(proxy: ProxyFactory, upstream: WatchedUpstream) -> None:
    p = _proxy(proxy, upstream)
    assert_openai_error(p.http().get(f"/v1/episodes/{new_id()}/trajectory"), 404,
                        "episode_not_found")
    plain = proxy({})  # no capture: turns kept, no token ids, append_only unknown
    eid = new_id()
    _rollout(plain, eid, 1)
    plain.http().post(f"/v1/episodes/{eid}/end")
    data = plain.http().get(f"/v1/episodes/{eid}/trajectory").json()
    assert data["append_only"] is None and "prompt_token_ids" not in data["turns"][0]
    assert data["turns"][0]["messages"] == [{"role": "user", "content": "begin"}]
    off = proxy({"rollouts": {"keep_turns": False}})
    eid = new_id()
    _rollout(off, eid, 1)
    off.http().post(f"/v1/episodes/{eid}/end")
    assert_openai_error(off.http().get(f"/v1/episodes/{eid}/trajectory"), 404,
                        "trajectory_not_found")


def test_bounded_memory_keeps_newest(proxy: ProxyFactory, upstream: WatchedUpstream) -> None:
    """Past rollouts.max_bytes the episodes written least recently are dropped first."""
    p = _proxy(proxy, upstream, rollouts={"max_bytes": 1000})
    ids = [new_id() for _ in range(4)]
    for eid in ids:
        _rollout(p, eid, 1)
        p.http().post(f"/v1/episodes/{eid}/end")
    got = [len(p.http().get(f"/v1/episodes/{eid}/trajectory").json()["turns"]) for eid in ids]
    assert got[-1] == 1 and got[0] == 0, got
