"""/v1/responses end to end: the official openai client and the Agents SDK through the real
proxy to the fake upstream; disclosure, finish and reject, records."""

from __future__ import annotations

import asyncio
from typing import Any

import openai
import pytest

from budgetproxy.config import FinishTexts
from budgetproxy.testing import FakeUpstream
from tests.conftest import Proxy, ProxyFactory, new_id

EXHAUSTED_TEXT = FinishTexts().turns

TEMPLATE = "[Turn budget] Turn {turn} of {total}."
TOOLS = [{"type": "function", "name": "look", "description": "look around",
          "parameters": {"type": "object", "properties": {"where": {"type": "string"}}}}]


def disclosed(proxy: ProxyFactory, **over: Any) -> Proxy:
    disc = {"mode": "disclosed", "template": TEMPLATE, **over}
    return proxy({"disclosure": disc})


def last_request(upstream: FakeUpstream, eid: str) -> dict[str, Any]:
    mine = [r for r in upstream.requests if r.path == "/v1/responses"
            and r.headers.get("x-test-episode") == eid]
    assert mine, "the upstream saw no call of this episode"
    body: dict[str, Any] = mine[-1].json
    return body


def client(p: Proxy, eid: str, **headers: str) -> openai.OpenAI:
    return p.client(default_headers={"X-Episode-Id": eid, "X-Test-Episode": eid, **headers})


@pytest.mark.parametrize("stream", [False, True])
def test_last_message_disclosure_reaches_the_upstream_and_the_turn_is_recorded(
        proxy: ProxyFactory, upstream: FakeUpstream, stream: bool) -> None:
    p = disclosed(proxy)
    eid = new_id()
    c = client(p, eid, **{"X-Episode-Budget": "4"})
    if stream:
        with c.responses.stream(model="m1", input="hello", instructions="be brief") as s:
            for _ in s:
                pass
            text = s.get_final_response().output_text
    else:
        text = c.responses.create(model="m1", input="hello", instructions="be brief").output_text
    assert last_request(upstream, eid)["input"] == "hello\n\n[Turn budget] Turn 1 of 4."
    assert text == "echo: hello\n\n[Turn budget] Turn 1 of 4."  # what the model answered
    (rec,) = p.wait_records(1, type="turn", episode_id=eid)
    assert rec["disclosure"]["text"] == "[Turn budget] Turn 1 of 4."
    assert rec["instructions"] == "be brief"
    assert rec["request_messages"] == [{"role": "user", "content": "hello"}]
    assert rec["response"]["content"] == text
    assert rec["finish_reason"] == "completed"
    assert rec["usage"]["input_tokens"] > 0 and rec["usage"]["output_tokens"] > 0


def test_items_history_keep_function_calls_and_instructions_logged_when_changed(
        proxy: ProxyFactory, upstream: FakeUpstream) -> None:
    p = disclosed(proxy)
    eid = new_id()
    c = client(p, eid, **{"X-Episode-Budget": "5"})
    items: list[Any] = [{"role": "user", "content": "find it"}]
    first = c.responses.create(model="m1", input=items, tools=TOOLS, instructions="sys")
    call = first.output[0]
    assert call.type == "function_call"
    items += [call.model_dump(exclude_none=True),
              {"type": "function_call_output", "call_id": call.call_id, "output": "a key"}]
    c.responses.create(model="m1", input=items, tools=TOOLS, instructions="sys")
    sent = last_request(upstream, eid)["input"]
    assert sent[0]["content"] == "find it\n\n[Turn budget] Turn 1 of 5."  # kept where it was
    assert sent[2]["output"] == "a key\n\n[Turn budget] Turn 2 of 5."  # where the model reads
    c.responses.create(model="m1", input=items, tools=TOOLS, instructions="changed")
    recs = p.wait_records(3, type="turn", episode_id=eid)
    assert recs[0]["response"]["tool_calls"][0]["function"]["name"] == "look"
    assert recs[0]["response"]["output"][0]["type"] == "function_call"
    assert (recs[1]["messages_offset"], len(recs[1]["request_messages"])) == (1, 2)
    assert "instructions" not in recs[1]
    assert recs[2]["instructions"] == "changed" and recs[2]["messages_offset"] == 0


def test_previous_response_id_places_the_text_on_the_new_input_only(
        proxy: ProxyFactory, upstream: FakeUpstream) -> None:
    p = disclosed(proxy)
    eid = new_id()
    c = client(p, eid, **{"X-Episode-Budget": "3"})
    first = c.responses.create(model="m1", input="start")
    c.responses.create(model="m1", previous_response_id=first.id,
                       input=[{"role": "user", "content": "more"}])
    assert last_request(upstream, eid)["input"] == [
        {"role": "user", "content": "more\n\n[Turn budget] Turn 2 of 3."}]


@pytest.mark.parametrize(("placement", "check"), [
    ("system", lambda body: body["instructions"] == "sys\n\n[Turn budget] Turn 1 of 2."),
    ("new_message", lambda body: body["input"][-1] == {
        "role": "user", "content": "[Turn budget] Turn 1 of 2."}),
])
def test_system_and_new_message_placements(proxy: ProxyFactory, upstream: FakeUpstream,
                                           placement: str, check: Any) -> None:
    p = disclosed(proxy, placement=placement)
    eid = new_id()
    client(p, eid, **{"X-Episode-Budget": "2"}).responses.create(
        model="m1", input=[{"role": "user", "content": "x"}], instructions="sys")
    assert check(last_request(upstream, eid))


@pytest.fixture(scope="module")
def finishing(proxy: ProxyFactory) -> Proxy:
    return proxy({"budget": {"on_exhausted": "finish"}})


def spend(p: Proxy, eid: str) -> None:
    p.client(default_headers={"X-Episode-Id": eid, "X-Episode-Budget": "1"}).responses.create(
        model="m1", input="only turn")


def test_finish_mode_answers_a_completed_response(finishing: Proxy,
                                                  upstream: FakeUpstream) -> None:
    eid = new_id()
    spend(finishing, eid)
    before = upstream.count("/v1/responses")
    raw = finishing.client(default_headers={"X-Episode-Id": eid}).responses.with_raw_response
    resp = raw.create(model="m1", input="again", tools=TOOLS)
    assert resp.headers["x-episode-exhausted"] == "true"
    r = resp.parse()
    assert (r.status, r.output_text, r.output[0].type) == ("completed", EXHAUSTED_TEXT, "message")
    assert r.usage is not None and r.usage.total_tokens == 0
    assert upstream.count("/v1/responses") == before  # nothing went upstream


def test_finish_mode_streams_the_event_sequence_clients_expect(finishing: Proxy) -> None:
    eid = new_id()
    spend(finishing, eid)
    c = finishing.client(default_headers={"X-Episode-Id": eid})
    with c.responses.stream(model="m1", input="again") as s:
        kinds = [e.type for e in s]
        final = s.get_final_response()
    assert kinds == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.content_part.added", "response.output_text.delta",
                     "response.output_text.done", "response.content_part.done",
                     "response.output_item.done", "response.completed"]
    assert final.output_text == EXHAUSTED_TEXT and final.status == "completed"
    rec = finishing.wait_records(2, type="turn", episode_id=eid)[-1]
    assert (rec["status"], rec["http_status"]) == ("synthetic", 200)


def test_reject_mode_is_a_403_the_sdk_does_not_retry(default_proxy: Proxy) -> None:
    eid = new_id()
    spend(default_proxy, eid)
    c = default_proxy.client(default_headers={"X-Episode-Id": eid}, max_retries=2)
    with pytest.raises(openai.PermissionDeniedError) as exc:
        c.responses.create(model="m1", input="again")
    assert exc.value.code == "turn_budget_exhausted"
    assert default_proxy.episode(eid)["turns_used"] == 1


# -- the Agents SDK, default (Responses) mode --------------------------------------------------

def run_agent(p: Proxy, eid: str, budget: int) -> Any:
    agents = pytest.importorskip("agents")
    agents.set_tracing_disabled(True)

    @agents.function_tool
    def look(where: str) -> str:
        """Look somewhere."""
        return f"nothing at {where}"

    async def go() -> Any:
        c = p.async_client(default_headers={"X-Episode-Id": eid, "X-Test-Episode": eid,
                                            "X-Episode-Budget": str(budget)})
        model = agents.OpenAIResponsesModel(model="m1", openai_client=c)
        agent = agents.Agent(name="finder", instructions="find the key", tools=[look],
                             model=model)
        try:
            return await agents.Runner.run(agent, "where is the key?", max_turns=10)
        finally:
            await c.close()

    return asyncio.run(go())


def test_agents_sdk_ends_normally_on_the_synthetic_reply_in_finish_mode(
        finishing: Proxy) -> None:
    # The fake calls the tool whenever tools are offered and the last item is not a tool
    # output: turn 1 calls it, turn 2 answers, so a budget of 1 ends on the synthetic reply.
    eid = new_id()
    result = run_agent(finishing, eid, budget=1)
    assert result.final_output == EXHAUSTED_TEXT
    assert finishing.episode(eid)["turns_used"] == 1


def test_agents_sdk_sees_the_refusal_in_reject_mode(default_proxy: Proxy) -> None:
    eid = new_id()
    with pytest.raises(openai.PermissionDeniedError):
        run_agent(default_proxy, eid, budget=1)


def test_agents_sdk_gets_the_disclosure_on_the_tool_output(
        proxy: ProxyFactory, upstream: FakeUpstream) -> None:
    p = disclosed(proxy)
    eid = new_id()
    result = run_agent(p, eid, budget=4)
    assert "Turn 2 of 4" in result.final_output  # the model answered the tool output + text
    sent = last_request(upstream, eid)["input"]
    assert sent[-1]["type"] == "function_call_output"
    assert sent[-1]["output"].endswith("[Turn budget] Turn 2 of 4.")
    assert "[Turn budget] Turn 1 of 4." in str(sent[0]["content"])


def test_langchain_use_responses_api_gets_the_disclosure(
        proxy: ProxyFactory, upstream: FakeUpstream) -> None:
    lc = pytest.importorskip("langchain_openai")
    p = disclosed(proxy)
    eid = new_id()
    llm = lc.ChatOpenAI(model="m1", base_url=p.base_url, api_key="x", use_responses_api=True,
                        max_retries=0, default_headers={"X-Episode-Id": eid,
                                                        "X-Test-Episode": eid,
                                                        "X-Episode-Budget": "2"})
    answer = llm.invoke("hello")
    assert "[Turn budget] Turn 1 of 2." in answer.text
    assert "[Turn budget] Turn 1 of 2." in str(last_request(upstream, eid)["input"])
    assert p.episode(eid)["turns_used"] == 1
