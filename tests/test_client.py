"""budgetproxy.client against the real proxy: episodes, bound OpenAI clients, clear errors."""

from __future__ import annotations

import openai
import pytest
from conftest import Proxy, ProxyFactory, free_port, new_id

from budgetproxy.client import AsyncBudgetClient, BudgetClient, BudgetProxyError

MESSAGES = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def metered(proxy: ProxyFactory) -> Proxy:
    return proxy({"metrics": {"enabled": True}})


def test_episode_lifecycle_through_the_bound_openai_client(metered: Proxy) -> None:
    with BudgetClient(metered.url) as api:
        ep = api.create_episode(budget=3, max_turns=12, task_id="t-client", tags={"who": "test"})
        assert ep.budget == 3 and ep.max_turns == 12 and ep.tier == "25%"
        assert ep.disclosure == "hidden" and ep.task_id == "t-client"
        assert ep.base_url == f"{metered.url}/episodes/{ep.episode_id}/v1"
        with ep.openai(max_retries=0) as llm:
            reply = llm.chat.completions.create(model="m1", messages=MESSAGES)  # type: ignore[arg-type]
            assert reply.choices[0].message is not None
        state = ep.status()
        assert (state["turns_used"], state["remaining"], state["status"]) == (1, 2, "active")
        final = ep.report(success=True, reward=1.0, metadata={"note": "ok"})
        assert final["end_reason"] == "success" and final["success_turn"] == 1
        assert ep.report(success=True, reward=1.0, metadata={"note": "ok"})["status"] == "finished"
        looked_up = api.episode(ep.episode_id)
        assert looked_up.episode_id == ep.episode_id and looked_up.base_url == ep.base_url
        assert "budgetproxy_turns_total" in api.metrics()


def test_errors_carry_the_openai_shaped_code(default_proxy: Proxy) -> None:
    with BudgetClient(default_proxy.url + "/v1/") as api:  # a /v1 URL works too
        eid = new_id()
        ep = api.create_episode(episode_id=eid, budget=2)
        with pytest.raises(BudgetProxyError) as exists:
            api.create_episode(episode_id=eid)
        assert (exists.value.status, exists.value.code) == (409, "episode_exists")
        assert "409 episode_exists" in str(exists.value)
        with pytest.raises(BudgetProxyError) as unknown:
            api.status(new_id())
        assert (unknown.value.status, unknown.value.code) == (404, "episode_not_found")
        with pytest.raises(BudgetProxyError) as bad:
            api.create_episode(budget=0)
        assert bad.value.code == "invalid_request" and bad.value.param == "budget"
        ep.report(success=False)
        with pytest.raises(BudgetProxyError) as conflict:
            ep.report(success=True)
        assert conflict.value.code == "outcome_conflict"


def test_a_spent_budget_surfaces_as_the_sdks_permission_error(default_proxy: Proxy) -> None:
    with BudgetClient(default_proxy.url) as api:
        ep = api.create_episode(budget=1)
        llm = ep.openai(max_retries=0)
        llm.chat.completions.create(model="m1", messages=MESSAGES)  # type: ignore[arg-type]
        with pytest.raises(openai.PermissionDeniedError) as refused:  # (an identical body
            # would be a free retry of turn 1)
            llm.chat.completions.create(model="m1", messages=MESSAGES * 2)  # type: ignore[arg-type]
        assert refused.value.code == "turn_budget_exhausted"
        llm.close()
        assert ep.end()["end_reason"] == "exhausted"


def test_header_style_clients_share_one_connection_pool(default_proxy: Proxy) -> None:
    with BudgetClient(default_proxy.url) as api, openai.OpenAI(
        base_url=default_proxy.base_url, api_key="k", max_retries=0
    ) as shared:
        a, b = api.create_episode(budget=5), api.create_episode(budget=5)
        shared.chat.completions.create(model="m1", messages=MESSAGES, extra_headers=a.headers)  # type: ignore[arg-type]
        bound = b.openai(like=shared)
        assert str(bound.base_url).rstrip("/") == b.base_url
        bound.chat.completions.create(model="m1", messages=MESSAGES)  # type: ignore[arg-type]
        bound.chat.completions.create(model="m1", messages=MESSAGES + MESSAGES)  # type: ignore[arg-type]
        assert (a.status()["turns_used"], b.status()["turns_used"]) == (1, 2)
        assert a.end()["end_reason"] == "abandoned"


async def test_async_flavour(default_proxy: Proxy) -> None:
    async with AsyncBudgetClient(default_proxy.url) as api:
        ep = await api.create_episode(budget=4, max_turns=8, task_id="t-async", group="g1")
        assert ep.group == "g1" and ep.tier == "50%"
        async with ep.async_openai(max_retries=0) as llm:
            await llm.chat.completions.create(model="m1", messages=MESSAGES)  # type: ignore[arg-type]
        assert (await ep.status())["turns_used"] == 1
        final = await ep.report(success=True, success_turn=1)
        assert final["outcome"] == "success"
        assert (await api.episode(ep.episode_id)).episode_id == ep.episode_id
        with pytest.raises(BudgetProxyError) as unknown:
            await api.end(new_id())
        assert unknown.value.code == "episode_not_found"


def test_proxy_keys_are_sent_and_missing_ones_are_clear(proxy: ProxyFactory) -> None:
    locked = proxy({"auth": {"keys": ["proxy-key-1"]}})
    with BudgetClient(locked.url, api_key="proxy-key-1") as api:
        ep = api.create_episode(budget=2)
        with ep.openai(max_retries=0) as llm:  # the SDK sends the same key to the proxy
            llm.chat.completions.create(model="m1", messages=MESSAGES)  # type: ignore[arg-type]
        assert ep.status()["turns_used"] == 1
    with BudgetClient(locked.url) as anonymous, pytest.raises(BudgetProxyError) as denied:
        anonymous.create_episode()
    assert (denied.value.status, denied.value.code) == (401, "invalid_api_key")


def test_an_unreachable_proxy_is_one_clear_error() -> None:
    with BudgetClient(f"http://127.0.0.1:{free_port()}", timeout=2) as api:
        with pytest.raises(BudgetProxyError) as down:
            api.create_episode()
    assert down.value.status is None and down.value.code == "proxy_unreachable"


def test_without_the_client_extra_the_error_says_what_to_install() -> None:
    """httpx and openai are not dependencies of the proxy; the client names the extra."""
    import subprocess
    import sys

    code = ("import sys; sys.modules['openai'] = None\n"
            "import importlib.util as u; real = u.find_spec\n"
            "u.find_spec = lambda n, *a: None if n == 'openai' else real(n, *a)\n"
            "from budgetproxy.client import BudgetClient\n"
            "BudgetClient('http://127.0.0.1:9')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last == ("ModuleNotFoundError: budgetproxy.client needs openai: "
                    "pip install 'budgetproxy[client]'")
