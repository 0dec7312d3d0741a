"""The inspect-ai integration's rules, as values (no inspect, no sockets), and the episode API
fields the call gate reads."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import ProxyFactory, new_id

from budgetproxy.core.ids import is_valid_episode_id
from budgetproxy.integrations import inspect_rules as rules


def test_the_integration_is_on_only_with_a_proxy_url() -> None:
    assert rules.connection({}) is None
    assert rules.connection({"BUDGETPROXY_URL": " "}) is None
    conn = rules.connection({"BUDGETPROXY_URL": "http://p:8080", "BUDGETPROXY_API_KEY": "k"})
    assert conn == rules.Connection("http://p:8080", "k")


def test_options_come_from_prefixed_metadata_later_layers_winning() -> None:
    opts = rules.options({"budgetproxy_budget": 4, "budgetproxy_max_turns": "8", "other": 1},
                         None, {"budgetproxy_budget": 2, "budgetproxy_disclosure": "disclosed",
                                "budgetproxy_success_threshold": "0.5"})
    assert opts == {"budget": 2, "max_turns": 8, "disclosure": "disclosed",
                    "success_threshold": 0.5}
    assert rules.episode_fields(opts) == {"budget": 2, "max_turns": 8,
                                          "disclosure": "disclosed"}


@pytest.mark.parametrize("meta, named", [
    ({"budgetproxy_budjet": 4}, "budgetproxy_budjet"),
    ({"budgetproxy_budget": "four"}, "budgetproxy_budget"),
    ({"budgetproxy_budget": True}, "budgetproxy_budget"),
    ({"budgetproxy_cost_budget": "nan"}, "budgetproxy_cost_budget"),
    ({"budgetproxy_disclosure": "loud"}, "budgetproxy_disclosure"),
])
def test_a_bad_option_is_an_error_naming_the_key(meta: dict[str, Any], named: str) -> None:
    with pytest.raises(rules.OptionError, match=named):
        rules.options(meta)


def test_episode_ids_name_eval_sample_epoch_and_attempt() -> None:
    assert rules.episode_id("E1", "cat", 2) == "E1:cat:2"
    assert rules.episode_id("E1", 7, 1, attempt=2) == "E1:7:1:a2"
    odd = rules.episode_id("E1", "what/is this?", 1)
    assert is_valid_episode_id(odd) and odd.startswith("E1:h")
    assert odd == rules.episode_id("E1", "what/is this?", 1)  # stable
    assert is_valid_episode_id(rules.episode_id("E" * 120, "s", 1))
    assert rules.task_id("what/is this?") == "what/is this?"
    assert rules.task_id("bad\u202eid") == rules.sample_part("bad\u202eid")


def test_a_score_becomes_an_outcome_by_a_configurable_rule() -> None:
    assert rules.outcome({"match": 1.0}, {}) == rules.Outcome(True, 1.0, "match")
    assert rules.outcome({"match": 0.5}, {}) == rules.Outcome(False, 0.5, "match")
    assert rules.outcome({"match": 0.5}, {"success_threshold": 0.5}).success  # type: ignore[union-attr]
    two = {"a": 0.0, "b": 1.0}
    assert rules.outcome(two, {}) == rules.Outcome(False, 0.0, "a")
    assert rules.outcome(two, {"scorer": "b"}) == rules.Outcome(True, 1.0, "b")
    assert rules.outcome(two, {"scorer": "c"}) is None
    assert rules.outcome({"a": None}, {}) is None and rules.outcome({}, {}) is None


def _status(**kw: Any) -> dict[str, Any]:
    return {"status": "active", "budget": 3, "turns_used": 1, "remaining": 2,
            "exhausted_by": None, **kw}


def test_the_gate_reads_the_episode_only_once_the_budget_could_be_spent() -> None:
    gate = rules.CallGate.of({"budget": 2, "on_exhausted": "reject", "finish_replies": 1})
    assert not gate.needs_status() and gate.admit(None) is None
    assert not gate.needs_status() and gate.admit(None) is None
    assert gate.needs_status()
    assert gate.admit(_status(budget=2, turns_used=1)) is None  # a refunded turn
    stop = gate.admit(_status(budget=2, turns_used=2))
    assert stop is not None and (stop.axis, stop.used, stop.limit) == ("turns", 2, 2)
    axes = rules.CallGate.of({"budget": 9, "token_budget": 100})
    assert axes.needs_status()
    stop = axes.admit(_status(budget=9, token_budget=100, tokens_used=120))
    assert stop is not None and stop.axis == "tokens"


def test_in_finish_mode_the_gate_lets_the_final_replies_through_then_stops() -> None:
    gate = rules.CallGate.of({"budget": 1, "on_exhausted": "finish", "finish_replies": 2})
    spent = _status(budget=1, turns_used=1)
    assert gate.admit(None) is None
    assert gate.admit(spent) is None and gate.admit(spent) is None
    assert gate.admit(spent) is not None
    finished = rules.CallGate.of({"budget": 5}).admit(_status(status="finished"))
    assert finished is not None and finished.axis == "finished"


def test_the_episode_api_says_what_a_call_past_the_budget_gets(proxy: ProxyFactory) -> None:
    p = proxy({"budget": {"on_exhausted": "finish", "finish_replies": 3}})
    eid = new_id()
    created = p.http().post("/v1/episodes", json={"episode_id": eid, "budget": 2}).json()
    assert (created["on_exhausted"], created["finish_replies"]) == ("finish", 3)
    got = p.episode(eid)
    assert (got["on_exhausted"], got["finish_replies"]) == ("finish", 3)
