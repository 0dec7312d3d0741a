"""The litellm upstream kind, through litellm's `openai/` provider against the fake upstream."""

from __future__ import annotations

# litellm is part of the [dev] extra: a missing install fails here rather than skipping.
import httpx
import litellm  # noqa: E402,F401
import openai
import pytest

from budgetproxy.config import load_config
from budgetproxy.serve.server import ProxyServer
from budgetproxy.testing.fake_upstream import FakeUpstream


@pytest.fixture(scope="module")
def upstream() -> FakeUpstream:
    up = FakeUpstream(models=["fake-model"]).start()
    yield up
    up.stop()


@pytest.fixture(scope="module")
def proxy(upstream: FakeUpstream, tmp_path_factory: pytest.TempPathFactory) -> ProxyServer:
    cfg = load_config(
        None,
        {
            "upstreams": [
                {"name": "via-litellm", "kind": "litellm", "base_url": upstream.base_url,
                 "model": "openai/fake-model", "api_key": "upstream-key", "models": ["claude-*"]},
                {"name": "direct", "base_url": upstream.base_url, "models": ["*"]},
            ],
            "trajectories": {"dir": str(tmp_path_factory.mktemp("traj"))},
        },
    )
    srv = ProxyServer(cfg).start()
    yield srv
    srv.stop()


def test_litellm_upstream_answers_in_openai_shape(proxy: ProxyServer, upstream: FakeUpstream):
    upstream.reset()
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="client-key")
    resp = client.chat.completions.with_raw_response.create(
        model="claude-test", messages=[{"role": "user", "content": "hello there"}],
        extra_headers={"X-Episode-Id": "lite-1", "X-Episode-Budget": "2"},
    )
    body = resp.parse()
    assert body.choices[0].message.content == "echo: hello there"
    assert body.model == "claude-test"
    assert resp.headers["x-episode-turn"] == "1"
    assert resp.headers["x-episode-remaining"] == "1"
    sent = upstream.requests[-1]
    assert sent.json["model"] == "fake-model"  # litellm stripped its provider prefix
    assert sent.headers["authorization"] == "Bearer upstream-key"


def test_litellm_stream_and_other_models_stay_on_fast_path(
    proxy: ProxyServer, upstream: FakeUpstream
):
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="client-key")
    chunks = list(client.chat.completions.create(
        model="claude-test", messages=[{"role": "user", "content": "stream me"}], stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "echo: stream me"
    upstream.reset()
    direct = client.chat.completions.create(
        model="fake-model", messages=[{"role": "user", "content": "direct"}])
    assert direct.choices[0].message.content == "echo: direct"
    assert upstream.requests[-1].headers.get("authorization") == "Bearer client-key"


def test_other_apis_to_a_litellm_upstream_are_a_clear_400(proxy: ProxyServer) -> None:
    with httpx.Client(base_url=proxy.url, timeout=10) as http:
        r = http.post("/v1/responses", json={"model": "claude-test", "input": "x"},
                      headers={"X-Episode-Id": "lite-2"})
        assert (r.status_code, r.json()["error"]["code"]) == (400, "unsupported_api")
        r = http.post("/v1/messages", json={"model": "claude-test", "max_tokens": 8,
                                            "messages": [{"role": "user", "content": "x"}]})
        assert r.status_code == 400 and r.json()["type"] == "error"
        assert "chat completions only" in r.json()["error"]["message"]
        assert http.get("/v1/episodes/lite-2").status_code == 404  # no turn was opened


@pytest.mark.parametrize("stream", [False, True])
def test_a_litellm_turn_is_logged_as_the_upstream_got_it(
    proxy: ProxyServer, upstream: FakeUpstream, stream: bool
) -> None:
    """litellm gets the payload as orjson read it, an integer past 64 bits as a float: the
    turn's record says what the upstream got, not the client's bytes it never saw."""
    import json
    import time
    from pathlib import Path

    from conftest import read_jsonl

    big = (1 << 70) + 1
    eid = f"lite-big-{int(stream)}-{time.time_ns()}"
    body = {"model": "claude-x", "stream": stream,
            "messages": [{"role": "user", "content": eid, "name": "u", "n": big}]}
    r = httpx.post(f"{proxy.url}/v1/chat/completions", content=json.dumps(body).encode(),
                   headers={"content-type": "application/json", "X-Episode-Id": eid}, timeout=60)
    assert r.status_code == 200, r.text
    (seen,) = [q for q in upstream.requests if eid.encode() in q.body]
    got = json.loads(seen.body)["messages"][0]["n"]
    assert got == float(big)
    deadline = time.monotonic() + 5
    while True:
        records = [rec for rec in read_jsonl(Path(proxy.config.trajectories.dir))
                   if rec.get("type") == "turn" and rec.get("episode_id") == eid]
        if records or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    (rec,) = records
    logged = rec["request_messages"][0]["n"]
    assert logged == got and type(logged) is float
