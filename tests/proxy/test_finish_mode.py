"""Finish mode end to end with the official clients: the final reply names the axis that ran
out, its turn record holds what the client was answered, and an agent that keeps asking is
answered episode_finished after `budget.finish_replies` final replies, in its API's shape."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import anthropic
import httpx
import openai
import pytest
from redis_support import REDIS_URL, drop_prefix, new_prefix, require_redis

from budgetproxy.config import FinishTexts
from tests.conftest import Proxy, ProxyFactory, new_id

CALLS = itertools.count()
FINISH = {"on_exhausted": "finish", "finish_reason": "stop"}


def ask(p: Proxy, api: str, eid: str, stream: bool = False, **headers: str) -> Any:
    """One call with the official client; the raw response (headers) and the reply's text.
    Each call's body is new (a resend of the previous one would be a free retry)."""
    hdrs = {"X-Episode-Id": eid, **headers}
    said = f"go on {next(CALLS)}"
    if api == "messages":
        c = anthropic.Anthropic(base_url=p.url, api_key="k", max_retries=0, timeout=20.0,
                                default_headers=hdrs)
        args: dict[str, Any] = {"model": "m1", "max_tokens": 50,
                                "messages": [{"role": "user", "content": said}]}
        if stream:
            with c.messages.stream(**args) as s:
                msg = s.get_final_message()
                return s.response, "".join(b.text for b in msg.content if b.type == "text")
        raw = c.messages.with_raw_response.create(**args)
        return raw, "".join(b.text for b in raw.parse().content if b.type == "text")
    oc = p.client(default_headers=hdrs)
    if api == "chat":
        raw = oc.chat.completions.with_raw_response.create(
            model="m1", messages=[{"role": "user", "content": said}], stream=stream)
        out = raw.parse()
        if stream:
            return raw, "".join(ch.choices[0].delta.content or "" for ch in out if ch.choices)
        return raw, out.choices[0].message.content
    raw = oc.responses.with_raw_response.create(model="m1", input=said, stream=stream)
    out = raw.parse()
    if stream:
        return raw, "".join(e.delta for e in out if e.type == "response.output_text.delta")
    return raw, out.output_text


@pytest.mark.parametrize(("header", "axis"), [
    ({"X-Episode-Budget": "1"}, "turns"),
    ({"X-Episode-Token-Budget": "5"}, "tokens"),
])
@pytest.mark.parametrize("api", ["chat", "responses", "messages"])
def test_the_final_reply_names_the_axis_that_ran_out(
        proxy: ProxyFactory, api: str, header: dict[str, str], axis: str) -> None:
    """The final reply's text is the one for the axis that ran out (a token-spent episode is
    told its tokens are spent, not its turns), and exhausted_by names that axis."""
    p = proxy({"budget": FINISH})
    eid = new_id()
    ask(p, api, eid, **header)  # spends the whole budget on that axis
    raw, text = ask(p, api, eid)
    assert raw.headers["x-episode-exhausted"] == "true"
    assert text == getattr(FinishTexts(), axis)
    assert p.episode(eid)["exhausted_by"] == axis


def test_each_axis_has_its_own_configurable_template(proxy: ProxyFactory) -> None:
    texts = {"turns": "No turns: {used} of {total}.", "tokens": "No tokens: {used}/{total}."}
    p = proxy({"budget": {**FINISH, "finish_texts": texts}})
    eid, other = new_id(), new_id()
    ask(p, "chat", eid, **{"X-Episode-Budget": "2"})
    ask(p, "chat", eid)
    assert ask(p, "chat", eid)[1] == "No turns: 2 of 2."
    ask(p, "chat", other, **{"X-Episode-Token-Budget": "5"})
    used = p.episode(other)["tokens_used"]
    assert ask(p, "chat", other)[1] == f"No tokens: {used}/5."


def test_a_template_that_does_not_render_is_a_config_error() -> None:
    from budgetproxy.config import ConfigError, load_config
    with pytest.raises(ConfigError, match="finish_texts"):
        load_config(None, {"budget": {"finish_texts": {"cost": "{remaining}"}}})


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("api", ["chat", "responses", "messages"])
def test_the_final_reply_is_logged_as_the_answer_it_was(
        proxy: ProxyFactory, api: str, stream: bool) -> None:
    """A finish-mode reply is logged as what the client got: status synthetic, HTTP 200, the
    reply as its response with its API's finish reason, the turn not charged."""
    p = proxy({"budget": FINISH})
    eid = new_id()
    ask(p, api, eid, **{"X-Episode-Budget": "1"})
    _, text = ask(p, api, eid, stream)
    rec = p.wait_records(2, type="turn", episode_id=eid)[-1]
    assert rec["status"] == "synthetic" and rec["http_status"] == 200, rec
    assert rec["response"]["role"] == "assistant" and rec["response"]["content"] == text
    assert rec["finish_reason"] == {"chat": "stop", "responses": "completed",
                                    "messages": "end_turn"}[api]
    assert rec["charged"] is False and rec["turn"] == 2 and rec["remaining"] == 0


def test_after_its_final_reply_an_episode_answers_episode_finished(
        proxy: ProxyFactory) -> None:
    """Past `budget.finish_replies` final replies, a further call is episode_finished: an agent
    that keeps asking ends."""
    p = proxy({"budget": FINISH})
    eid = new_id()
    ask(p, "chat", eid, **{"X-Episode-Budget": "1"})
    assert ask(p, "chat", eid)[0].headers["x-episode-exhausted"] == "true"
    client = p.client(max_retries=3, default_headers={"X-Episode-Id": eid})
    with pytest.raises(openai.PermissionDeniedError) as info:
        client.chat.completions.create(model="m1", messages=[{"role": "user", "content": "x"}])
    assert info.value.code == "episode_finished"
    assert info.value.response.headers["x-should-retry"] == "false"
    recs = p.wait_records(3, type="turn", episode_id=eid)
    assert [r["status"] for r in recs] == ["ok", "synthetic", "rejected"]
    assert recs[-1]["http_status"] == 403
    ep = p.episode(eid)
    assert ep["status"] == "active" and ep["exhausted"] is True  # the harness still reports


def test_episode_finished_comes_in_the_anthropic_shape_on_messages(
        proxy: ProxyFactory) -> None:
    p = proxy({"budget": FINISH})
    eid = new_id()
    ask(p, "messages", eid, **{"X-Episode-Budget": "1"})
    ask(p, "messages", eid)
    r = httpx.post(p.url + "/v1/messages", headers={"X-Episode-Id": eid, "x-api-key": "k"},
                   json={"model": "m1", "max_tokens": 5,
                         "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 403 and r.headers["x-should-retry"] == "false"
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == "permission_error", body
    assert "finished" in body["error"]["message"]


@pytest.mark.parametrize("replies", [2, None])
def test_finish_replies_sets_how_many_final_replies_an_episode_gets(
        proxy: ProxyFactory, replies: int | None) -> None:
    p = proxy({"budget": {**FINISH, "finish_replies": replies}})
    eid = new_id()
    ask(p, "chat", eid, **{"X-Episode-Budget": "1"})
    for _ in range(2 if replies else 4):
        assert ask(p, "chat", eid)[0].headers["x-episode-exhausted"] == "true"
    if replies is not None:
        with pytest.raises(openai.PermissionDeniedError, match="had its final"):
            ask(p, "chat", eid)


def test_final_replies_are_counted_across_replicas_sharing_redis(
        proxy: ProxyFactory) -> None:
    require_redis()
    prefix = new_prefix()
    cfg = {"budget": FINISH, "store": {"kind": "redis", "url": REDIS_URL, "key_prefix": prefix}}
    a, b = proxy(cfg, fresh=True), proxy(cfg, fresh=True)
    try:
        eid = new_id()
        ask(a, "chat", eid, **{"X-Episode-Budget": "1"})
        assert ask(b, "chat", eid)[0].headers["x-episode-exhausted"] == "true"
        for p in (a, b):
            with pytest.raises(openai.PermissionDeniedError, match="had its final"):
                ask(p, "chat", eid)
    finally:
        drop_prefix(prefix)


def test_an_agents_sdk_harness_that_keeps_asking_ends_within_the_bound(
        proxy: ProxyFactory) -> None:
    """A harness that runs the agent again after each final answer ("keep going"): the first
    run after the budget ends on the final reply, the next gets episode_finished, which the
    SDK (retries on) does not retry."""
    agents = pytest.importorskip("agents")
    agents.set_tracing_disabled(True)
    p = proxy({"budget": FINISH})
    eid = new_id()

    @agents.function_tool
    def look(where: str) -> str:
        """Look somewhere."""
        return f"nothing at {where}"

    async def harness() -> tuple[list[str], BaseException | None]:
        c = openai.AsyncOpenAI(base_url=p.base_url, api_key="k", max_retries=2,
                               default_headers={"X-Episode-Id": eid, "X-Episode-Budget": "1"})
        agent = agents.Agent(name="finder", instructions="find the key", tools=[look],
                             model=agents.OpenAIResponsesModel(model="m1", openai_client=c))
        said: list[str] = []
        items: Any = "where is the key?"
        try:
            for _ in range(10):
                result = await agents.Runner.run(agent, items, max_turns=10)
                said.append(result.final_output)
                items = [*result.to_input_list(), {"role": "user", "content": "keep going"}]
        except openai.APIStatusError as e:
            return said, e
        finally:
            await c.close()
        return said, None

    said, err = asyncio.run(harness())
    assert said == [FinishTexts().turns]
    assert isinstance(err, openai.PermissionDeniedError) and err.code == "episode_finished"
    recs = p.wait_records(3, type="turn", episode_id=eid)
    assert [r["status"] for r in recs] == ["ok", "synthetic", "rejected"]  # no SDK retry


def test_a_langchain_loop_that_keeps_asking_ends_within_the_bound(proxy: ProxyFactory) -> None:
    import langchain_openai as lc

    p = proxy({"budget": {**FINISH, "finish_replies": 2}})
    eid = new_id()
    llm = lc.ChatOpenAI(model="m1", base_url=p.base_url, api_key="k", max_retries=2,
                        default_headers={"X-Episode-Id": eid, "X-Episode-Budget": "2"})
    history: list[Any] = [("user", "start")]
    answers = []
    with pytest.raises(openai.PermissionDeniedError, match="had its final 2 replies"):
        for i in range(20):
            answer = llm.invoke(history)
            answers.append(answer.text)
            history += [answer, ("user", f"keep going {i}")]
    assert answers[2:] == [FinishTexts().turns] * 2 and len(answers) == 4
    assert p.episode(eid)["turns_used"] == 2


def test_a_langgraph_react_agent_ends_on_the_final_reply(proxy: ProxyFactory) -> None:
    """A LangGraph ReAct loop (ToolNode, tools_condition) calls its tool while the model asks
    for it; the final reply has no tool call, so the graph ends there, normally."""
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition

    @tool
    def look(where: str) -> str:
        """Look somewhere."""
        return f"nothing at {where}"

    p = proxy({"budget": {**FINISH, "finish_replies": 1}})
    eid = new_id()
    llm = ChatOpenAI(model="m1", base_url=p.base_url, api_key="k", max_retries=2,
                     default_headers={"X-Episode-Id": eid, "X-Episode-Budget": "1"})
    bound = llm.bind_tools([look])

    def model(state: MessagesState) -> dict[str, Any]:
        return {"messages": [bound.invoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("model", model)
    graph.add_node("tools", ToolNode([look]))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition)
    graph.add_edge("tools", "model")
    result = graph.compile().invoke({"messages": [("user", "find the key")]},
                                    {"recursion_limit": 20})
    last = result["messages"][-1]
    assert last.content == FinishTexts().turns and not last.tool_calls
    assert [m.type for m in result["messages"]] == ["human", "ai", "tool", "ai"]
    assert p.episode(eid)["turns_used"] == 1
    recs = p.wait_records(2, type="turn", episode_id=eid)
    assert [r["status"] for r in recs] == ["ok", "synthetic"]


def test_a_langgraph_loop_that_keeps_asking_ends_within_the_bound(proxy: ProxyFactory) -> None:
    """A graph that sends the model back to work after every answer: it gets its final reply
    once, then episode_finished (403, not retried), which ends the run."""
    from langchain_openai import ChatOpenAI
    from langgraph.graph import END, START, MessagesState, StateGraph

    p = proxy({"budget": {**FINISH, "finish_replies": 1}})
    eid = new_id()
    llm = ChatOpenAI(model="m1", base_url=p.base_url, api_key="k", max_retries=2,
                     default_headers={"X-Episode-Id": eid, "X-Episode-Budget": "2"})

    def model(state: MessagesState) -> dict[str, Any]:
        return {"messages": [llm.invoke(state["messages"])]}

    def nudge(state: MessagesState) -> dict[str, Any]:
        return {"messages": [("user", "keep going")]}

    graph = StateGraph(MessagesState)
    graph.add_node("model", model)
    graph.add_node("nudge", nudge)
    graph.add_edge(START, "model")
    graph.add_edge("model", "nudge")
    graph.add_conditional_edges("nudge", lambda _: "model", ["model", END])
    with pytest.raises(openai.PermissionDeniedError) as err:
        graph.compile().invoke({"messages": [("user", "start")]}, {"recursion_limit": 50})
    assert err.value.code == "episode_finished"
    recs = p.wait_records(4, type="turn", episode_id=eid)
    assert [r["status"] for r in recs] == ["ok", "ok", "synthetic", "rejected"]  # no retry
