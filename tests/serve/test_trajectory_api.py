"""GET /v1/episodes/{id}/trajectory: turns as the model saw them, with captured tokens."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from conftest import (
    Proxy,
    ProxyFactory,
    WatchedUpstream,
    assert_openai_error,
    eventually,
    new_id,
)
from redis_support import REDIS_URL, drop_prefix, new_prefix, require_redis

from budgetproxy.proxy.dialects import DIALECTS
from budgetproxy.testing import fake_tokens

TEMPLATE = "[Turn budget] Turn {turn} of {total}."
MESSAGES = DIALECTS["/v1/messages"]


def _proxy(proxy: ProxyFactory, upstream: WatchedUpstream, **extra: Any) -> Proxy:
    return proxy({"upstreams": [{"name": "main", "base_url": upstream.base_url,
                                 "capture_tokens": True}],
                  "disclosure": {"mode": "disclosed", "template": TEMPLATE}, **extra})


def _settled_trajectory(p: Proxy, eid: str) -> Any:
    """The ended episode's trajectory once its last turn settled: a streamed turn settles just
    after the client has its last event, and until then the episode is settling (409)."""
    return eventually(lambda: p.http().get(f"/v1/episodes/{eid}/trajectory"),
                      lambda r: r.status_code != 409)


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


def test_messages_and_responses_turns_are_what_the_upstream_got(
        proxy: ProxyFactory, upstream: WatchedUpstream) -> None:
    """The memory log reads each turn's messages back from the body the upstream got: the
    dialect's conversation of it (Anthropic cache_control markers left out, the system prompt
    or instructions its head), with the disclosure text in place."""
    import anthropic

    p = proxy({"disclosure": {"mode": "disclosed", "template": TEMPLATE}})
    eid = new_id()
    claude = anthropic.Anthropic(base_url=p.url, api_key="sk-client-key", max_retries=0,
                                 timeout=20.0, default_headers={"X-Episode-Id": eid,
                                                                "X-Episode-Budget": "4"})
    block = {"type": "text", "text": "hello", "cache_control": {"type": "ephemeral"}}
    claude.messages.create(model="m1", max_tokens=16, system="Be brief.",
                           messages=[{"role": "user", "content": [block]}])  # type: ignore[list-item]
    p.http().post(f"/v1/episodes/{eid}/end")
    turn = p.http().get(f"/v1/episodes/{eid}/trajectory").json()["turns"][0]
    assert turn["messages"] == [
        {"system": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "hello"},
                                     {"type": "text", "text": "[Turn budget] Turn 1 of 4."}]}]
    assert turn["disclosure_text"] == "[Turn budget] Turn 1 of 4."

    rid = new_id()
    p.client().responses.create(model="m1", instructions="Be brief.", input="hi",
                                extra_headers={"X-Episode-Id": rid})
    p.http().post(f"/v1/episodes/{rid}/end")
    turn = p.http().get(f"/v1/episodes/{rid}/trajectory").json()["turns"][0]
    assert turn["messages"][0] == {"instructions": "Be brief."}
    assert turn["messages"][1]["content"].startswith("hi")
    assert turn["messages"][1]["content"].endswith("[Turn budget] Turn 1 of 20.")


def test_content_none_leaves_texts_out_of_kept_turns(proxy: ProxyFactory,
                                                     upstream: WatchedUpstream) -> None:
    p = _proxy(proxy, upstream, trajectories={"content": "none"})
    eid = new_id()
    _rollout(p, eid, 1)
    p.http().post(f"/v1/episodes/{eid}/end")
    turn = p.http().get(f"/v1/episodes/{eid}/trajectory").json()["turns"][0]
    sent = "begin\n\n[Turn budget] Turn 1 of 4."
    assert turn["messages"] == [{"role": "user", "content": {"length": len(sent)}}]
    assert turn["disclosure_text"] == {"length": len("[Turn budget] Turn 1 of 4.")}
    assert set(turn["response"]["content"]) == {"length"}


def test_plain_and_streamed_turns_read_back_as_the_client_got_them(
        proxy: ProxyFactory, upstream: WatchedUpstream) -> None:
    """A non-streamed turn is kept as the bodies it was made of and written when read; a
    streamed one as its fields: both read back with the reply, finish reason and usage the
    client got, the disclosure text and the messages the upstream got."""
    p = proxy({"disclosure": {"mode": "disclosed", "template": TEMPLATE}})
    eid = new_id()
    client = p.client(default_headers={"X-Episode-Id": eid, "X-Episode-Budget": "4"})
    messages: list[dict[str, Any]] = [{"role": "user", "content": "begin"}]
    plain = client.chat.completions.create(model="m1", messages=messages)  # type: ignore[arg-type]
    messages += [{"role": "assistant", "content": plain.choices[0].message.content},
                 {"role": "user", "content": "go on"}]
    pieces = list(client.chat.completions.create(
        model="m1", messages=messages, stream=True,  # type: ignore[arg-type]
        stream_options={"include_usage": True}))
    streamed = "".join(c.choices[0].delta.content or "" for c in pieces if c.choices)
    p.http().post(f"/v1/episodes/{eid}/end")
    first, second = _settled_trajectory(p, eid).json()["turns"]
    assert first["turn"] == 1 and first["attempt"] == 1
    assert first["response"]["content"] == plain.choices[0].message.content
    assert first["finish_reason"] == plain.choices[0].finish_reason
    assert plain.usage is not None
    assert first["usage"]["total_tokens"] == plain.usage.total_tokens
    assert first["disclosure_text"] == "[Turn budget] Turn 1 of 4."
    assert first["messages"] == [{"role": "user",
                                  "content": "begin\n\n[Turn budget] Turn 1 of 4."}]
    assert second["turn"] == 2 and second["response"]["content"] == streamed
    assert second["messages"][-1]["content"] == "go on\n\n[Turn budget] Turn 2 of 4."
    usage = next(c.usage for c in pieces if c.usage is not None)
    assert second["usage"]["total_tokens"] == usage.total_tokens


@pytest.mark.parametrize("store", ["memory", "redis"])
@pytest.mark.parametrize("arm", [{"mode": "disclosed", "history": "keep"}, {"mode": "hidden"},
                                 {"mode": "disclosed", "placement": "system"}])
def test_a_long_episode_keeps_each_turn_as_what_is_new(
    proxy: ProxyFactory, upstream: WatchedUpstream, store: str, arm: dict[str, Any]
) -> None:
    """Turn after turn the upstream's conversation extends the previous one (the disclosed arm
    re-applies each text where it was): each kept turn holds only its new messages, and the
    trajectory still gives every turn the messages the upstream got. A system-prompt text
    changes the conversation's start every turn: those turns are kept whole."""
    over: dict[str, Any] = {"disclosure": {"template": TEMPLATE, **arm}}
    with _on_store(proxy, store, over) as (p, prefix):
        eid = new_id()
        start = [{"role": "system", "content": "sys " * 50},
                 {"role": "user", "content": "begin " * 100}]
        data = _session(p, eid, "/v1/chat/completions", start, 12,
                        lambda history: {"model": "m1", "messages": history})
        seen = [q.json["messages"] for q in upstream.requests
                if q.headers.get("x-test-episode") == eid]
        assert [t["messages"] for t in data["turns"]] == seen
        assert not any(t.get("truncated") for t in data["turns"])
        kept = _kept_entries(p, eid, prefix)
        assert len(kept) == 12
        whole = arm.get("placement") == "system"
        assert [b'"messages_after"' in e for e in kept] == [False] + [not whole] * 11
        if not whole:  # what a turn keeps does not grow with the episode
            assert max(len(e) for e in kept[1:]) < 4000 < len(str(seen[-1]))


def _session(p: Proxy, eid: str, path: str, start: list[dict[str, Any]], turns: int,
             body: Callable[[list[dict[str, Any]]], dict[str, Any]]) -> dict[str, Any]:
    """An episode of `turns` calls, each with the history so far and two messages more; its
    trajectory once ended."""
    history = list(start)
    http = p.http()
    for t in range(1, turns + 1):
        r = http.post(path, json=body(history), headers={
            "X-Episode-Id": eid, "X-Episode-Budget": "20", "X-Test-Episode": eid})
        assert r.status_code == 200, r.text
        history += [{"role": "assistant", "content": f"answer {t} " * 100},
                    {"role": "user", "content": f"step {t} " * 100}]
    http.post(f"/v1/episodes/{eid}/end")
    data: dict[str, Any] = http.get(f"/v1/episodes/{eid}/trajectory").json()
    return data


def _newest_marked(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The history as Claude Code sends it: the newest message one text block, marked."""
    return [*history[:-1], {"role": "user", "content": [
        {"type": "text", "text": history[-1]["content"], "cache_control": {"type": "ephemeral"}}]}]


def _blocks_newest_marked(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The same with every user message a text block: only the marker moves."""
    out = [{**m, "content": [{"type": "text", "text": m["content"]}]} if m["role"] == "user"
           else m for m in history]
    out[-1]["content"][0]["cache_control"] = {"type": "ephemeral"}
    return out


@contextlib.contextmanager
def _on_store(proxy: ProxyFactory, store: str,
              over: dict[str, Any]) -> Iterator[tuple[Proxy, str | None]]:
    """A proxy with `over` on the memory store, or on Redis under a key prefix of its own
    (yielded, and deleted after)."""
    prefix = None
    if store == "redis":
        require_redis()
        prefix = new_prefix()
        over = {**over, "store": {"kind": "redis", "url": REDIS_URL, "key_prefix": prefix}}
    try:
        yield proxy(over), prefix
    finally:
        if prefix is not None:
            drop_prefix(prefix)


def _kept_entries(p: Proxy, eid: str, prefix: str | None) -> list[bytes]:
    """The turn log's entries of an episode as stored (before `expand`)."""
    if prefix is not None:
        import redis

        raw = redis.Redis.from_url(REDIS_URL)
        try:
            entries: list[bytes] = raw.lrange(f"{prefix}:turns:{{{eid}}}", 0, -1)
        finally:
            raw.close()
        return entries
    log = p.server.app.turn_log
    return [e if isinstance(e, bytes) else e.encode() for e in log._eps[eid].entries]


@pytest.mark.parametrize("store", ["memory", "redis"])
@pytest.mark.parametrize("shape", ["flips", "blocks"])
def test_a_long_claude_code_session_keeps_each_turn_as_what_is_new(
    proxy: ProxyFactory, upstream: WatchedUpstream, store: str, shape: str
) -> None:
    """Claude Code's shape on /v1/messages, disclosed: the newest block marked each turn, so
    the body's earlier messages change from turn to turn. With the newest prompt a block and
    the earlier ones strings (`flips`), the turn log compares what it writes with the previous
    entry's messages: with Redis (which writes each entry) a turn is kept as its new messages;
    in memory entries are the bodies sent, read back when asked for. With every prompt a
    block (`blocks`: only the marker moves), a turn from the third on takes the previous
    turn's placed messages and is kept as its new ones in either store. Either way the
    trajectory gives each turn the conversation the upstream got."""
    over: dict[str, Any] = {"disclosure": {"mode": "disclosed", "template": TEMPLATE,
                                           "history": "keep"}}
    marked = _newest_marked if shape == "flips" else _blocks_newest_marked
    with _on_store(proxy, store, over) as (p, prefix):
        eid = new_id()
        data = _session(p, eid, "/v1/messages", [{"role": "user", "content": "begin " * 100}],
                        10, lambda history: {"model": "m1", "max_tokens": 16, "system": "sys",
                                             "messages": marked(history)})
        seen = [MESSAGES.conversation(q.json) for q in upstream.requests
                if q.headers.get("x-test-episode") == eid]
        assert [t["messages"] for t in data["turns"]] == seen
        assert not any(t.get("truncated") for t in data["turns"])
        kept = _kept_entries(p, eid, prefix)
        after = [b'"messages_after"' in e for e in kept]
        if shape == "flips":
            assert after == [False] + [store == "redis"] * 9
        else:  # (the second turn's first prompt was the first turn's newest: no base yet)
            assert after == [False] + [store == "redis"] + [True] * 8
        if store == "redis" or shape == "blocks":
            assert max(len(e) for e in kept[2:]) < 6000 < 2 * 6000 < len(str(seen[-1]))


@pytest.mark.parametrize("rollouts", [True, False])
def test_an_ended_episode_leaves_nothing_kept_for_its_next_turn(
    proxy: ProxyFactory, upstream: WatchedUpstream, rollouts: bool
) -> None:
    """What a process keeps of an episode's last turn for its next one (its conversation, its
    last kept entry, the earlier texts its turn re-applied) is dropped when the episode ends:
    an ended episode has no next turn."""
    p = proxy({"disclosure": {"mode": "disclosed", "template": TEMPLATE, "history": "keep"},
               "rollouts": {"keep_turns": rollouts}})
    eid = new_id()
    app = p.server.app
    history: list[dict[str, Any]] = [{"role": "user", "content": "u1"}]
    for t in (1, 2):
        r = p.http().post("/v1/chat/completions", json={"model": "m1", "messages": history},
                          headers={"X-Episode-Id": eid, "X-Episode-Budget": "9"})
        assert r.status_code == 200, r.text
        history += [{"role": "assistant", "content": f"a{t}"}, {"role": "user", "content": "u"}]
    assert app.calls.prefixes.get(eid) is not None
    assert app.calls.turns.replays.pairs == 1  # (turn 2 re-applied turn 1's text)
    if rollouts:  # (kept just after the answer is sent)
        assert eventually(lambda: eid in app.recorder._last_kept, bool)
    p.http().post(f"/v1/episodes/{eid}/outcome", json={"success": True})
    assert app.calls.prefixes.get(eid) is None and app.calls.prefixes.size == 0
    assert app.calls.turns.replays.pairs == 0
    if rollouts:
        assert eid not in app.recorder._last_kept


def _hidden_turns(http: Any, eid: str, messages: list[dict[str, Any]], start: int, end: int,
                  size: int = 50) -> None:
    for t in range(start, end):
        r = http.post("/v1/chat/completions", json={"model": "m1", "messages": messages},
                      headers={"X-Episode-Id": eid, "X-Episode-Budget": "20",
                               "X-Test-Episode": eid})
        assert r.status_code == 200, r.text
        messages += [{"role": "assistant", "content": f"answer {t} " * size},
                     {"role": "user", "content": f"step {t} " * size}]


def test_an_episode_the_memory_log_dropped_keeps_its_later_turns_whole(
    proxy: ProxyFactory, upstream: WatchedUpstream
) -> None:
    """The memory log drops the episode written least recently past `rollouts.max_bytes`;
    that episode's later turns do not follow the turns it no longer holds: they are kept
    whole, and read back with every message."""
    p = proxy({"disclosure": {"mode": "hidden"}, "rollouts": {"max_bytes": 60_000}})
    http = p.http()
    a, b = new_id(), new_id()
    ma: list[dict[str, Any]] = [{"role": "user", "content": "begin " * 50}]
    mb: list[dict[str, Any]] = [{"role": "user", "content": "other " * 50}]
    _hidden_turns(http, a, ma, 1, 3)
    _hidden_turns(http, b, mb, 1, 12, size=1000)  # pushes a out of the log
    _hidden_turns(http, a, ma, 3, 6)
    http.post(f"/v1/episodes/{a}/end")
    data = http.get(f"/v1/episodes/{a}/trajectory").json()
    seen = [q.json["messages"] for q in upstream.requests
            if q.headers.get("x-test-episode") == a][2:]
    turns = [t for t in data["turns"] if t["turn"] >= 3]
    assert [t.get("truncated") for t in turns] == [None, None, None]
    assert [t["messages"] for t in turns] == seen


def test_a_turn_redis_lost_leaves_the_turns_after_it_whole(
    proxy: ProxyFactory, upstream: WatchedUpstream
) -> None:
    """A turn whose write to Redis fails is lost (logged); the next one, kept as what follows
    it, finds it missing in Redis and is written whole, so the turns after it read back with
    every message."""
    with _on_store(proxy, "redis", {"disclosure": {"mode": "hidden"}}) as (p, prefix):
        log = p.server.app.turn_log
        real = log._store.submit
        appends = 0

        def submit(script: Any, keys: Any, args: Any, *more: Any) -> Any:
            nonlocal appends
            if script is log._append:
                appends += 1
                if appends == 2:  # turn 2's write fails
                    fut = asyncio.get_running_loop().create_future()
                    fut.set_exception(ConnectionError("redis down"))
                    return fut
            return real(script, keys, args, *more)

        log._store.submit = submit
        http = p.http()
        eid = new_id()
        messages: list[dict[str, Any]] = [{"role": "user", "content": "begin " * 50}]
        _hidden_turns(http, eid, messages, 1, 6)
        http.post(f"/v1/episodes/{eid}/end")
        data = http.get(f"/v1/episodes/{eid}/trajectory").json()
        seen = [q.json["messages"] for q in upstream.requests
                if q.headers.get("x-test-episode") == eid]
        got = {t["turn"]: t for t in data["turns"]}
        assert sorted(got) == [1, 3, 4, 5]
        assert [got[t].get("truncated") for t in (3, 4, 5)] == [None, None, None]
        assert [got[t]["messages"] for t in (3, 4, 5)] == seen[2:]
        kept = _kept_entries(p, eid, prefix)
        assert [b'"messages_after"' in e for e in kept] == [False, False, True, True]


@pytest.mark.parametrize("store", ["memory", "redis"])
@pytest.mark.parametrize("stream", [False, True])
def test_a_turn_with_an_integer_past_64_bits_keeps_its_messages_exact(
    proxy: ProxyFactory, upstream: WatchedUpstream, store: str, stream: bool
) -> None:
    """A body with an integer orjson cannot hold (past 64 bits) is sent upstream exact
    (proxy/wire.py); its kept turn gives the messages the upstream got with that integer,
    not a turn without messages, and so do the turns after it."""
    import json

    import httpx

    over = {"disclosure": {"mode": "disclosed", "template": TEMPLATE, "history": "keep"}}
    eid = new_id()
    big = 123456789012345678901234567891
    messages: list[dict[str, Any]] = [{"role": "user", "content": "begin", "n": big}]
    with _on_store(proxy, store, over) as (p, _):
        for t in range(1, 4):
            body = {"model": "m1", "messages": messages, "stream": stream}
            r = httpx.post(f"{p.url}/v1/chat/completions", content=json.dumps(body).encode(),
                           headers={"content-type": "application/json", "X-Episode-Id": eid},
                           timeout=20)
            assert r.status_code == 200, r.text
            messages = [*messages, {"role": "assistant", "content": f"a{t}"},
                        {"role": "user", "content": f"u{t}"}]
        p.http().post(f"/v1/episodes/{eid}/outcome", json={"success": True})
        r = _settled_trajectory(p, eid)
        assert r.status_code == 200, r.text
        turns = json.loads(r.content)["turns"]  # (the standard library keeps the integer)
        assert [t.get("truncated") for t in turns] == [None, None, None]
        for t in turns:
            assert t["messages"][0]["n"] == big, t
            assert t["messages"][0]["content"].startswith("begin")
        assert len(turns[2]["messages"]) == 5



@pytest.mark.parametrize("store", ["memory", "redis"])
@pytest.mark.parametrize("depth", [300, 960])
def test_a_deeply_nested_turn_with_an_integer_past_64_bits_is_served(
    proxy: ProxyFactory, upstream: WatchedUpstream, store: str, depth: int
) -> None:
    """Such a turn's messages are written by the standard library (orjson refuses both the
    integer and the depth): the trajectory gives them exact where the response can hold them,
    and the turn without its messages (`truncated`) where nesting reaches the standard
    library's own limit — an answer either way, never a 500."""
    import json

    import httpx

    over = {"disclosure": {"mode": "disclosed", "template": TEMPLATE}}
    eid = new_id()
    big = (1 << 70) + 1  # (no float is)
    deep = "[" * depth + str(big) + "]" * depth
    raw = (b'{"model":"m1","messages":[{"role":"user","content":"begin","deep":'
           + deep.encode() + b"}]}")
    with _on_store(proxy, store, over) as (p, _):
        r = httpx.post(f"{p.url}/v1/chat/completions", content=raw, timeout=20,
                       headers={"content-type": "application/json", "X-Episode-Id": eid})
        assert r.status_code == 200, r.text[:300]
        p.http().post(f"/v1/episodes/{eid}/outcome", json={"success": True})
        r = p.http().get(f"/v1/episodes/{eid}/trajectory")
        assert r.status_code == 200, r.text[:300]
        (turn,) = json.loads(r.content)["turns"]
        if depth == 300:
            value = turn["messages"][0]["deep"]
            for _ in range(depth):
                (value,) = value
            assert value == big and type(value) is int
        else:
            assert turn["messages"] is None and turn["truncated"] is True


def _sent_logged_kept(p: Proxy, upstream: WatchedUpstream, stream: bool,
                     conversations: list[list[dict[str, Any]]]) -> list[list[Any]]:
    """Send each conversation as a chat turn of one episode (JSON written by the standard
    library), end it, and give [what the upstream got, what the turn records say, what the
    trajectory says] of each turn's messages, all read by the standard library."""
    import json

    import httpx

    eid = new_id()
    for conversation in conversations:
        body = {"model": "m1", "messages": conversation, "stream": stream}
        r = httpx.post(f"{p.url}/v1/chat/completions", content=json.dumps(body).encode(),
                       headers={"content-type": "application/json", "X-Episode-Id": eid,
                                "X-Test-Episode": eid}, timeout=20)
        assert r.status_code == 200, r.text
    sent = [json.loads(q.body)["messages"] for q in upstream.requests
            if q.headers.get("x-test-episode") == eid]
    logged, rebuilt = [], []
    for rec in sorted(p.wait_records(len(conversations), type="turn", episode_id=eid),
                      key=lambda r: r["turn"]):
        logged = logged[:rec["messages_offset"]] + rec["request_messages"]
        rebuilt.append(logged)
    p.http().post(f"/v1/episodes/{eid}/outcome", json={"success": True})
    r = p.http().get(f"/v1/episodes/{eid}/trajectory")
    assert r.status_code == 200, r.text
    return [sent, rebuilt, [t["messages"] for t in json.loads(r.content)["turns"]]]


@pytest.mark.parametrize("store", ["memory", "redis"])
@pytest.mark.parametrize("stream", [False, True])
def test_a_body_forwarded_as_sent_is_logged_and_kept_with_its_integers_exact(
    proxy: ProxyFactory, upstream: WatchedUpstream, store: str, stream: bool
) -> None:
    """The hidden arm forwards a body as the client wrote it, an integer past 64 bits
    included; its turn records and its kept turns give that integer too, not the float orjson
    read it as, on the first turn and on a later one that adds another such integer."""
    big, other = 123456789012345678901234567891, -98765432109876543210987  # (no float is)
    conversations = [[{"role": "user", "content": "begin", "n": big}]]
    for t in range(1, 3):
        conversations.append([*conversations[-1], {"role": "assistant", "content": f"a{t}"},
                              {"role": "user", "content": f"u{t}",
                               **({"m": other} if t == 1 else {})}])
    with _on_store(proxy, store, {"disclosure": {"mode": "hidden"}}) as (p, _):
        sent, logged, kept = _sent_logged_kept(p, upstream, stream, conversations)
    assert sent == conversations  # (forwarded as written)
    assert logged == kept == sent


@pytest.mark.parametrize("store", ["memory", "redis"])
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("mode", ["hidden", "disclosed"])
def test_an_earlier_integer_changed_to_one_orjson_reads_as_the_same_float_is_logged(
    proxy: ProxyFactory, upstream: WatchedUpstream, store: str, stream: bool, mode: str
) -> None:
    """2**70 + 1 and 2**70 + 3 read as the same float, so the digests of two conversations
    that differ only there are equal: a conversation with such integers is logged whole, and
    kept whole, each turn with the integers it was sent with."""
    first, changed = (1 << 70) + 1, (1 << 70) + 3
    conversations = [[{"role": "user", "content": "begin", "n": first}]]
    for t in range(1, 3):
        conversations.append([{**conversations[-1][0], "n": changed}, *conversations[-1][1:],
                              {"role": "assistant", "content": f"a{t}"},
                              {"role": "user", "content": f"u{t}"}])
    over = {"disclosure": {"mode": mode, "template": TEMPLATE, "history": "keep"}}
    with _on_store(proxy, store, over) as (p, _):
        sent, logged, kept = _sent_logged_kept(p, upstream, stream, conversations)
    assert [m[0]["n"] for m in sent] == [first, changed, changed]
    assert [m[0]["n"] for m in logged] == [first, changed, changed]
    assert kept == sent
