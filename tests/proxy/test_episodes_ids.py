"""Episode ids on the wire: header, alias header, /episodes/{id} path prefix, validation."""

from __future__ import annotations

import openai
import pytest
from conftest import Proxy, ProxyFactory, assert_openai_error, chat_body, new_id

from budgetproxy.testing import FakeUpstream


@pytest.fixture(scope="module")
def aliased(proxy: ProxyFactory) -> Proxy:
    return proxy({"episodes": {"id_headers": ["X-Claude-Code-Session-Id"]}})


def test_header_id_counts_turns(default_proxy: Proxy) -> None:
    eid = new_id()
    client = default_proxy.client(default_headers={"X-Episode-Id": eid})
    for turn in (1, 2):
        raw = client.chat.completions.with_raw_response.create(
            model="m1", messages=[{"role": "user", "content": f"turn {turn}"}])
        assert raw.headers["x-episode-id"] == eid
        assert raw.headers["x-episode-turn"] == str(turn)
    assert default_proxy.episode(eid)["turns_used"] == 2


def test_alias_header_and_x_episode_id_both_work(aliased: Proxy, upstream: FakeUpstream) -> None:
    sid = new_id("session")
    client = aliased.client(default_headers={"X-Claude-Code-Session-Id": sid})
    raw = client.chat.completions.with_raw_response.create(
        model="m1", messages=[{"role": "user", "content": "alias"}])
    assert raw.headers["x-episode-id"] == sid
    assert aliased.episode(sid)["turns_used"] == 1
    eid = new_id()
    aliased.client(default_headers={"X-Episode-Id": eid}).chat.completions.create(
        model="m1", messages=[{"role": "user", "content": "canonical"}])
    assert aliased.episode(eid)["turns_used"] == 1
    assert "x-episode-id" not in upstream.requests[-1].headers


def test_alias_is_not_an_id_without_config(default_proxy: Proxy) -> None:
    sid = new_id("session")
    raw = default_proxy.client().chat.completions.with_raw_response.create(
        model="m1", messages=[{"role": "user", "content": "x"}],
        extra_headers={"X-Claude-Code-Session-Id": sid})
    assert "x-episode-id" not in raw.headers


def test_path_prefix_with_the_sdk_base_url(default_proxy: Proxy) -> None:
    eid = new_id()
    client = default_proxy.client(base_url=f"{default_proxy.url}/episodes/{eid}/v1")
    for turn in (1, 2, 3):
        raw = client.chat.completions.with_raw_response.create(
            model="m1", messages=[{"role": "user", "content": f"p{turn}"}])
        assert raw.headers["x-episode-turn"] == str(turn)
        assert raw.headers["x-episode-id"] == eid
    streamed = "".join(
        c.choices[0].delta.content or ""
        for c in client.chat.completions.create(
            model="m1", messages=[{"role": "user", "content": "s"}], stream=True)
        if c.choices
    )
    assert streamed == "echo: s"
    assert client.completions.create(model="m1", prompt="q").choices[0].text == "echo: q"
    # Other routes work under the prefix too, uncounted.
    assert [m.id for m in client.models.list().data]
    assert client.embeddings.create(model="m1", input="e").data
    assert default_proxy.episode(eid)["turns_used"] == 5


def test_same_id_in_header_and_path_is_fine(default_proxy: Proxy) -> None:
    eid = new_id()
    with default_proxy.http() as http:
        r = http.post(f"/episodes/{eid}/v1/chat/completions", json=chat_body(),
                      headers={"X-Episode-Id": eid})
    assert r.status_code == 200 and r.headers["x-episode-id"] == eid


def test_header_and_path_that_disagree_are_400(
    default_proxy: Proxy, upstream: FakeUpstream
) -> None:
    before = len(upstream.requests)
    with default_proxy.http() as http:
        r = http.post(f"/episodes/{new_id()}/v1/chat/completions", json=chat_body(),
                      headers={"X-Episode-Id": new_id()})
    assert_openai_error(r, 400, "invalid_episode_id")
    assert len(upstream.requests) == before


@pytest.mark.parametrize(
    "bad", ["has space", "x" * 129, "a/b", "semi;colon", "émoji", "quote'", "star*", "a+b", ".",
            ".."]
)
def test_invalid_header_ids_are_400(default_proxy: Proxy, upstream: FakeUpstream, bad: str) -> None:
    before = len(upstream.requests)
    with default_proxy.http() as http:
        r = http.post("/v1/chat/completions", json=chat_body(),
                      headers={"X-Episode-Id": bad.encode("utf-8")})  # type: ignore[dict-item]
    assert_openai_error(r, 400, "invalid_episode_id")
    assert len(upstream.requests) == before


@pytest.mark.parametrize("bad", ["has%20space", "x" * 129, "semi%3Bcolon", "%C3%A9", "a%2Bb"])
def test_invalid_path_ids_are_400(default_proxy: Proxy, bad: str) -> None:
    with default_proxy.http() as http:
        r = http.post(f"/episodes/{bad}/v1/chat/completions", json=chat_body())
    assert_openai_error(r, 400, "invalid_episode_id")


@pytest.mark.parametrize("good", ["A-Za-z0-9._:-", "x" * 128, "1", "run:7.task_3-k", "..."])
def test_valid_ids(default_proxy: Proxy, good: str) -> None:
    eid = good if len(good) == 128 else good + new_id("-")  # fresh on every run
    with default_proxy.http() as http:
        r = http.post("/v1/chat/completions", json=chat_body(), headers={"X-Episode-Id": eid})
        assert r.status_code == 200, r.text
        r2 = http.post(f"/episodes/{eid}/v1/chat/completions", json=chat_body("again"))
        assert r2.status_code == 200, r2.text
    assert r2.headers["x-episode-turn"] == "2"


def test_require_id(proxy: ProxyFactory, upstream: FakeUpstream) -> None:
    p = proxy({"episodes": {"require_id": True}})
    before = len(upstream.requests)
    with p.http() as http:
        for path, body in (("/v1/chat/completions", chat_body()),
                           ("/v1/completions", {"model": "m1", "prompt": "x"})):
            assert_openai_error(http.post(path, json=body), 400, "episode_id_required")
    with pytest.raises(openai.BadRequestError) as info:
        p.client().chat.completions.create(model="m1", messages=[{"role": "user", "content": "x"}])
    assert info.value.code == "episode_id_required"
    assert len(upstream.requests) == before
    # With an id (header or path) it goes through; pass-through routes need none.
    eid = new_id()
    p.client(default_headers={"X-Episode-Id": eid}).chat.completions.create(
        model="m1", messages=[{"role": "user", "content": "x"}])
    p.client(base_url=f"{p.url}/episodes/{eid}/v1").chat.completions.create(
        model="m1", messages=[{"role": "user", "content": "y"}])
    assert p.episode(eid)["turns_used"] == 2
    assert p.client().embeddings.create(model="m1", input="free").data


def test_path_prefix_and_x_episode_id_win_over_an_alias(aliased: Proxy) -> None:
    """Claude Code sends its session id on every call: it never conflicts with the id the
    harness chose by path or X-Episode-Id."""
    eid, sid = new_id(), new_id("session")
    by_path = aliased.client(base_url=f"{aliased.url}/episodes/{eid}/v1",
                             default_headers={"X-Claude-Code-Session-Id": sid})
    raw = by_path.chat.completions.with_raw_response.create(
        model="m1", messages=[{"role": "user", "content": "path"}])
    assert raw.headers["x-episode-id"] == eid
    by_header = aliased.client(default_headers={"X-Claude-Code-Session-Id": sid,
                                                "X-Episode-Id": eid})
    raw = by_header.chat.completions.with_raw_response.create(
        model="m1", messages=[{"role": "user", "content": "header"}])
    assert raw.headers["x-episode-id"] == eid
    assert aliased.episode(eid)["turns_used"] == 2
    assert aliased.http().get(f"/v1/episodes/{sid}").status_code == 404


@pytest.mark.parametrize(("preset", "header"), [
    ("claude_code", "X-Claude-Code-Session-Id"), ("codex", "session-id"),
    ("litellm", "x-litellm-session-id"), ("helicone", "Helicone-Session-Id")])
def test_id_header_presets_name_each_agents_session_header(
        proxy: ProxyFactory, preset: str, header: str) -> None:
    p = proxy({"episodes": {"id_header_presets": [preset]}})
    sid = new_id("session")
    raw = p.client().chat.completions.with_raw_response.create(
        model="m1", messages=[{"role": "user", "content": "x"}], extra_headers={header: sid})
    assert raw.headers["x-episode-id"] == sid


def test_capability_probe_prompts_spend_no_turn(proxy: ProxyFactory) -> None:
    probe = "Please say 'hello, world'"
    p = proxy({"episodes": {"uncounted_prompts": [probe]}})
    eid = new_id()
    c = p.client(default_headers={"X-Episode-Id": eid})
    c.responses.create(model="m1", input=probe, reasoning={"effort": "low"})
    c.chat.completions.create(model="m1", messages=[{"role": "user", "content": probe}])
    raw = c.chat.completions.with_raw_response.create(
        model="m1", messages=[{"role": "user", "content": probe},
                              {"role": "assistant", "content": "hello, world"},
                              {"role": "user", "content": probe}])
    assert raw.headers["x-episode-turn"] == "1"  # a real conversation is a turn
