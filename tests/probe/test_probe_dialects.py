"""Probe on every API: states logged from /v1/messages and /v1/responses are replayed on
their own route, in their own shape, with the disclosure where the proxy placed it. Behind
an upstream that echoes what it was sent, a replay must get the very answer its turn got."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from aiohttp import web
from conftest import eventually, read_jsonl

from budgetproxy.cli import main
from budgetproxy.client import BudgetClient
from budgetproxy.config import load_config
from budgetproxy.probe import replay
from budgetproxy.serve.server import ProxyServer
from budgetproxy.testing import FakeUpstream

TASKS = ("t1", "t2")


class EchoUpstream(FakeUpstream):
    """Answers Messages and Responses calls with the conversation it received, as JSON."""

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        return await super()._messages(request.clone(
            headers={**request.headers, "X-Fake-Echo-Request": "1"}))

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        return await super()._responses(request.clone(
            headers={**request.headers, "X-Fake-Echo-Request": "1"}))


def _wait(logs: Path, n: int) -> None:
    deadline = time.monotonic() + 10
    while sum(r["type"] == "episode" for r in read_jsonl(logs)) < n:
        assert time.monotonic() < deadline
        time.sleep(0.05)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ProxyServer, Path]]:
    yield from _served(tmp_path_factory, "last_message")


@pytest.fixture(scope="module", params=["system", "new_message"])
def placed(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[tuple[ProxyServer, Path, str]]:
    for server, logs in _served(tmp_path_factory, request.param):
        yield server, logs, request.param


def _served(tmp_path_factory: pytest.TempPathFactory, placement: str
            ) -> Iterator[tuple[ProxyServer, Path]]:
    """Per task, A (disclosed, so each turn's budget line is placed) and B (hidden) play three
    turns over Messages with the official anthropic client, and over Responses with the
    official openai client, through a proxy placing the texts by `placement`."""
    logs = tmp_path_factory.mktemp("dialect-logs")
    up = EchoUpstream(models=["m-a", "m-b"]).start()
    config = load_config(None, {"upstreams": [{"name": "echo", "base_url": up.base_url}],
                                "trajectories": {"dir": str(logs)},
                                "disclosure": {"placement": placement},
                                "metrics": {"enabled": False}})
    server = ProxyServer(config).start()
    with BudgetClient(server.url) as api:
        for policy, model, arm in (("A", "m-a", "disclosed"), ("B", "m-b", "hidden")):
            for task in TASKS:
                ep = api.create_episode(budget=5, max_turns=5, task_id=task, disclosure=arm,
                                        tags={"policy": policy, "api": "messages"})
                claude = anthropic.Anthropic(base_url=ep.base_url.removesuffix("/v1"),
                                             api_key="k", max_retries=0)
                msgs: list[Any] = [{"role": "user", "content": f"start {task}"}]
                for turn in range(3):
                    reply = claude.messages.create(model=model, max_tokens=64, system="Play.",
                                                   messages=msgs)
                    msgs += [{"role": "assistant", "content": reply.content[0].text},  # type: ignore[union-attr]
                             {"role": "user", "content": [{"type": "text",
                                                           "text": f"went on {turn}"}]}]
                ep.report(success=True)
                ep = api.create_episode(budget=5, max_turns=5, task_id=task, disclosure=arm,
                                        tags={"policy": policy, "api": "responses"})
                llm = openai.OpenAI(base_url=ep.base_url, api_key="k", max_retries=0)
                items: list[Any] = [{"role": "user", "content": f"start {task}"}]
                for turn in range(3):
                    r = llm.responses.create(model=model, instructions="Play.", input=items)
                    items += [{"role": "assistant", "content": r.output_text},
                              {"role": "user", "content": f"went on {turn}"}]
                ep.report(success=True)
    _wait(logs, 2 * len(TASKS) * 2)
    yield server, logs
    server.stop()
    up.stop()


@pytest.mark.parametrize("api,route", [("messages", replay.MESSAGES),
                                       ("responses", replay.RESPONSES)])
def test_states_replay_on_their_own_api_as_the_model_saw_them(
    setup: tuple[ProxyServer, Path], capsys: pytest.CaptureFixture[str], api: str, route: str,
) -> None:
    server, logs = setup
    turns = [r for r in read_jsonl(logs) if r["type"] == "turn"]
    assert {r["route"] for r in turns} == {replay.MESSAGES, replay.RESPONSES}
    code = main(["probe", str(logs), "--proxy", server.url, "--a", "policy=A", "--b",
                 "policy=B", "--scorer", "probe_scorers:as_logged", "--states", "12",
                 "--samples", "1", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    result = json.loads(out)
    assert result["settings"]["scorer_failures"] == 0
    assert result["settings"]["sampling_failures"] == 0
    # Every action, A's model and B's alike, is the answer the state's own turn got: the
    # upstream saw the same conversation (system or instructions, and every budget line the
    # proxy had placed, turn after turn) as when the episode ran.
    states = result["states"]
    assert states and all(s["a_mean"] == s["b_mean"] == 1.0 for s in states)
    assert result["single_step"]["tie_rate"] == 1.0
    # (each probe call's record is written off the path, after its answer)
    probes = eventually(lambda: [r for r in read_jsonl(logs) if r["type"] == "probe"
                                 and r["probe_id"] == result["settings"]["probe_id"]],
                        lambda found: len(found) >= result["settings"]["probe_calls"])
    assert len(probes) == result["settings"]["probe_calls"]
    mine = [r for r in probes if r["route"] == route]
    assert mine and all(r["status"] == "ok" for r in probes)
    # A's disclosed states carry their budget lines; they are in what was sent
    assert any("[Turn budget]" in json.dumps(r["request_messages"]) for r in mine)


def test_a_messages_state_is_rebuilt_in_messages_shape() -> None:
    items = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "x",
                                           "content": "ok"}]}]
    seen, _, placed = replay.place(replay.MESSAGES, items[:1], None, "one", [])
    assert seen == [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                 {"type": "text", "text": "one"}]}]
    seen, _, placed = replay.place(replay.MESSAGES, items, None, "two", placed)
    assert seen[0]["content"][-1] == {"type": "text", "text": "one"}
    assert seen[2]["content"][-1] == {"type": "text", "text": "two"}
    assert seen[2]["content"][0]["type"] == "tool_result"  # the text goes after it
    assert placed == [(0, "one"), (2, "two")]
    assert replay.action_of(replay.MESSAGES, {"content": [
        {"type": "text", "text": "hi"}, {"type": "tool_use", "id": "t1", "name": "move",
                                         "input": {"d": 1}}]}) == {
        "role": "assistant", "content": "hi", "tool_calls": [
            {"id": "t1", "type": "function",
             "function": {"name": "move", "arguments": '{"d": 1}'}}]}


def test_a_responses_state_is_rebuilt_in_responses_shape() -> None:
    items: list[Any] = [{"role": "user", "content": "a"},
                        {"type": "function_call", "call_id": "c1", "name": "move",
                         "arguments": "{}"},
                        {"type": "function_call_output", "call_id": "c1", "output": "ok"}]
    seen, _, placed = replay.place(replay.RESPONSES, items[:1], None, "one", [])
    assert seen == [{"role": "user", "content": "a\n\none"}]
    # a tool's output is read by the model: the text joins it
    seen, _, placed = replay.place(replay.RESPONSES, items, None, "two", placed)
    assert seen[0]["content"] == "a\n\none" and seen[2]["output"] == "ok\n\ntwo"
    # an assistant message last: the text is a new user item
    after = [*items, {"role": "assistant", "content": "done"}]
    seen, _, placed = replay.place(replay.RESPONSES, after, None, "three", placed)
    assert seen[-1] == {"role": "user", "content": "three"} and len(seen) == len(after) + 1
    assert replay.action_of(replay.RESPONSES, {"output": [
        {"type": "message", "content": [{"type": "output_text", "text": "hi"}]},
        {"type": "function_call", "call_id": "c2", "name": "move",
         "arguments": '{"d": 1}'}]}) == {
        "role": "assistant", "content": "hi", "tool_calls": [
            {"id": "c2", "type": "function",
             "function": {"name": "move", "arguments": '{"d": 1}'}}]}
    assert replay.route_of({"turn": 1}) == replay.CHAT  # records from before routes were logged
    body = replay.body(replay.RESPONSES, seen, "Play.", "m", 7, None)
    assert body == {"model": "m", "input": seen, "store": False, "instructions": "Play."}


def test_every_placement_replays_as_the_model_saw_it(
    placed: tuple[ProxyServer, Path, str], capsys: pytest.CaptureFixture[str],
) -> None:
    server, logs, placement = placed
    argv = ["probe", str(logs), "--proxy", server.url, "--a", "policy=A", "--b", "policy=B",
            "--scorer", "probe_scorers:as_logged", "--states", "12", "--samples", "1", "--json"]
    assert main([*argv, "--placement", placement]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["settings"]["placement"] == placement
    assert all(s["a_mean"] == s["b_mean"] == 1.0 for s in result["states"])
    # told the wrong placement, disclosed states are rebuilt otherwise than the model saw them
    assert main(argv) == 0
    wrong = json.loads(capsys.readouterr().out)["states"]
    assert any(s["a_mean"] == 0.0 for s in wrong)
