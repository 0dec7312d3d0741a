"""A request asking for several completions (`n`, `best_of`, a list of prompts) holds its
output cap for each of them: a token or cost budget bounds what they write together. Run
with the official openai client through the real proxy, against an upstream that honours
every count and writes each completion to its cap (the worst an episode can meet)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from aiohttp import web
from conftest import assert_openai_error, eventually, read_jsonl
from redis_support import REDIS_URL, drop_prefix, require_redis

from budgetproxy.config import load_config
from budgetproxy.proxy.output_cap import completions
from budgetproxy.serve.local_server import LocalAiohttpServer
from budgetproxy.serve.server import ProxyServer

UNCAPPED = 1000  # what the upstream writes for a completion with no cap


def test_completions_counts_what_an_upstream_may_write() -> None:
    assert completions("chat", {"messages": []}) == 1
    assert completions("chat", {"n": 4}) == 4
    assert completions("chat", {"n": 2, "best_of": 5}) == 5
    assert completions("chat", {"n": 3.0}) == 3 and completions("chat", {"n": "3"}) == 3
    assert completions("chat", {"n": 2.5}) == 3  # (an upstream that rounds up)
    assert completions("chat", {"n": 0}) == 1 and completions("chat", {"n": True}) == 1
    assert completions("chat", {"n": "many"}) == 1 and completions("chat", {"n": None}) == 1
    assert completions("completions", {"prompt": ["a", "b", "c"], "best_of": 2}) == 6
    assert completions("completions", {"prompt": [[1, 2], [3]], "n": 2}) == 4
    assert completions("completions", {"prompt": [1, 2, 3]}) == 1  # one prompt, as tokens
    assert completions("completions", {"prompt": "a", "n": 7}) == 7
    # the Responses and Messages APIs ask for one
    assert completions("responses", {"n": 4}) == 1 and completions("messages", {"n": 4}) == 1


class GreedyUpstream(LocalAiohttpServer):
    """Chat and text completions that honour n, best_of and prompt lists, every completion
    as long as its cap allows, usage counting every sample (best_of's unreturned ones too)."""

    def __init__(self) -> None:
        super().__init__()
        self.bodies: list[dict[str, Any]] = []

    def build_app(self) -> web.Application:
        def counts(body: dict[str, Any], prompts: int) -> tuple[int, int, int]:
            cap = body.get("max_completion_tokens") or body.get("max_tokens") or UNCAPPED
            n = int(body.get("n") or 1)
            return n, max(n, int(body.get("best_of") or 1)) * prompts, int(cap)

        async def chat(request: web.Request) -> web.Response:
            body = await request.json()
            self.bodies.append(body)
            n, samples, cap = counts(body, 1)
            choices = [{"index": i, "finish_reason": "length",
                        "message": {"role": "assistant", "content": " ".join(["w"] * cap)}}
                       for i in range(n)]
            return web.json_response({
                "id": "c1", "object": "chat.completion", "created": 0, "model": body["model"],
                "choices": choices, "usage": {"prompt_tokens": 3, "completion_tokens":
                                              samples * cap, "total_tokens": 3 + samples * cap}})

        async def text(request: web.Request) -> web.Response:
            body = await request.json()
            self.bodies.append(body)
            prompt = body.get("prompt")
            prompts = len(prompt) if isinstance(prompt, list) and prompt and not isinstance(
                prompt[0], int) else 1
            n, samples, cap = counts(body, prompts)
            choices = [{"index": i, "text": " w" * cap, "logprobs": None,
                        "finish_reason": "length"} for i in range(n * prompts)]
            return web.json_response({
                "id": "t1", "object": "text_completion", "created": 0, "model": body["model"],
                "choices": choices, "usage": {"prompt_tokens": 3, "completion_tokens":
                                              samples * cap, "total_tokens": 3 + samples * cap}})

        app = web.Application()
        app.router.add_post("/v1/chat/completions", chat)
        app.router.add_post("/v1/completions", text)
        return app


@pytest.fixture(scope="module")
def greedy() -> Iterator[GreedyUpstream]:
    with GreedyUpstream() as up:
        yield up


@pytest.fixture(scope="module", params=["memory", "redis"])
def served(request: pytest.FixtureRequest, greedy: GreedyUpstream,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ProxyServer, Path]]:
    """A proxy on each store: the memory one, and Redis's scripts (the hold is theirs)."""
    logs = tmp_path_factory.mktemp("counts")
    over: dict[str, Any] = {
        "upstreams": [{"base_url": greedy.base_url}], "trajectories": {"dir": str(logs)},
        "budget": {"output_hold_tokens": 50},
        "prices": {"m1": {"input_per_mtok": 1000.0, "output_per_mtok": 2000.0}}}
    prefix = f"bptest-counts-{uuid.uuid4().hex[:8]}:"
    if request.param == "redis":
        require_redis()
        over["store"] = {"kind": "redis", "url": REDIS_URL, "key_prefix": prefix}
    try:
        with ProxyServer(load_config(None, over)) as srv:
            yield srv, logs
    finally:
        if request.param == "redis":
            drop_prefix(prefix)


def client(srv: ProxyServer, eid: str, **headers: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="k", max_retries=0,
                         default_headers={"X-Episode-Id": eid, **headers})


def episode(srv: ProxyServer, eid: str) -> dict[str, Any]:
    view: dict[str, Any] = openai.OpenAI(base_url=srv.url + "/v1", api_key="k").get(
        f"/episodes/{eid}", cast_to=object)  # type: ignore[arg-type]
    return view


def test_n_completions_share_a_token_budget(served: tuple[ProxyServer, Path],
                                            greedy: GreedyUpstream) -> None:
    srv, _ = served
    eid = f"n-{uuid.uuid4().hex[:8]}"
    out = client(srv, eid, **{"X-Episode-Token-Budget": "100"}).chat.completions.create(
        model="m1", messages=[{"role": "user", "content": "go"}], n=4, max_tokens=1000)
    sent = greedy.bodies[-1]
    assert sent["n"] == 4 and sent["max_tokens"] == 25  # 100 tokens shared by four
    assert len(out.choices) == 4
    ep = episode(srv, eid)
    assert ep["tokens_used"] == 3 + 100  # its prompt, and four completions of 25
    # nothing is left for another call: refused as spent
    with pytest.raises(openai.PermissionDeniedError):
        client(srv, eid).chat.completions.create(
            model="m1", messages=[{"role": "user", "content": "go"}], max_tokens=5)


def test_best_of_and_prompt_lists_count_every_sample(served: tuple[ProxyServer, Path],
                                                     greedy: GreedyUpstream) -> None:
    srv, _ = served
    eid = f"best-{uuid.uuid4().hex[:8]}"
    client(srv, eid, **{"X-Episode-Token-Budget": "60"}).completions.create(
        model="m1", prompt=["a", "b", "c"], best_of=2, n=1, max_tokens=100)
    sent = greedy.bodies[-1]
    assert sent["max_tokens"] == 10  # 3 prompts x 2 samples share 60
    assert episode(srv, eid)["tokens_used"] <= 3 + 60


@pytest.mark.parametrize(("budget", "cap"), [(10000, None), (120, 40)])
def test_a_call_without_a_cap_holds_the_usual_most_for_each(
        served: tuple[ProxyServer, Path], greedy: GreedyUpstream, budget: int,
        cap: int | None) -> None:
    """budget.output_hold_tokens (50 here) for each of 3: with 150 or more left no cap is
    added, as for one completion; with less, what is left is shared."""
    srv, _ = served
    eid = f"hold-{uuid.uuid4().hex[:8]}"
    client(srv, eid, **{"X-Episode-Token-Budget": str(budget)}).chat.completions.create(
        model="m1", messages=[{"role": "user", "content": "go"}], n=3)
    assert greedy.bodies[-1].get("max_completion_tokens") == cap


def test_a_cost_budget_is_shared_the_same_way(served: tuple[ProxyServer, Path],
                                              greedy: GreedyUpstream) -> None:
    srv, _ = served
    eid = f"cost-{uuid.uuid4().hex[:8]}"
    client(srv, eid, **{"X-Episode-Cost-Budget": "0.02"}).chat.completions.create(
        model="m1", messages=[{"role": "user", "content": "go"}], n=2, max_tokens=100)
    assert greedy.bodies[-1]["max_tokens"] == 5  # $0.02 buys 10 output tokens: 5 each
    ep = episode(srv, eid)
    assert ep["cost_used"] == pytest.approx(3 * 0.001 + 10 * 0.002)


def test_more_completions_than_tokens_left_is_a_400_and_takes_no_turn(
        served: tuple[ProxyServer, Path], greedy: GreedyUpstream) -> None:
    srv, logs = served
    eid = f"many-{uuid.uuid4().hex[:8]}"
    before = len(greedy.bodies)
    with pytest.raises(openai.BadRequestError) as err:
        client(srv, eid, **{"X-Episode-Token-Budget": "10"}).chat.completions.create(
            model="m1", messages=[{"role": "user", "content": "go"}], n=64)
    assert_openai_error(err.value.response, 400, "invalid_request", "n")
    assert "64 completions" in err.value.response.json()["error"]["message"]
    assert len(greedy.bodies) == before  # nothing went upstream
    ep = episode(srv, eid)
    assert ep["turns_used"] == 0 and ep["tokens_used"] == 0 and ep["status"] == "active"
    rec = eventually(lambda: [r for r in read_jsonl(logs) if r.get("episode_id") == eid],
                     lambda recs: len(recs) == 1)[0]
    assert rec["status"] == "rejected" and rec["http_status"] == 400 and not rec["charged"]
    # the episode serves a call that asks for one
    client(srv, eid).chat.completions.create(
        model="m1", messages=[{"role": "user", "content": "go"}])
    assert episode(srv, eid)["turns_used"] == 1
