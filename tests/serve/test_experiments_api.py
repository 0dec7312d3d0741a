"""Live experiments on the real server: arms assigned and applied, records, the API, the stop."""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any

import pytest
from conftest import Proxy, ProxyFactory, assert_openai_error, chat_body, new_id
from experiments_support import EXPERIMENT, report, run_episode
from experiments_support import experiment_config as _config

from budgetproxy.analysis.experiment import read_experiment


def test_arms_assigned_applied_and_recorded(proxy: ProxyFactory) -> None:
    p = proxy(_config())
    arms = {}
    for i in range(12):
        eid = new_id()
        arms[eid] = run_episode(p, eid, **{"X-Episode-Task": f"t{i % 3}"})
        report(p, eid, arms[eid] == "hidden")
    assert set(arms.values()) == {"hidden", "told-wrong"}
    for eid, arm in arms.items():
        ep = p.episode(eid)
        assert ep["disclosure"] == ("hidden" if arm == "hidden" else "disclosed")
    records = p.wait_records(len(arms), type="episode", experiment="disclosure")
    assert {r["episode_id"]: r["arm"] for r in records} == arms
    told = next(e for e, a in arms.items() if a == "told-wrong")
    turns = p.records(type="turn", episode_id=told)
    assert turns and all(t["experiment"] == "disclosure" and t["arm"] == "told-wrong"
                         for t in turns)
    assert turns[0]["disclosure"]["text"] == "[Budget] 3 turns in all."
    assert next(r for r in records if r["episode_id"] == told)["announced_budget"] == 3

    view = p.http().get("/v1/experiments/disclosure").json()
    assert [a["name"] for a in view["arms"]] == ["hidden", "told-wrong"]
    counts = {a["name"]: (a["episodes"], a["successes"]) for a in view["arms"]}
    n_hidden = sum(a == "hidden" for a in arms.values())
    assert counts == {"hidden": (n_hidden, n_hidden), "told-wrong": (12 - n_hidden, 0)}
    diff = view["difference"]
    assert -1 <= diff["cs_low"] <= diff["cs_high"] <= 1
    assert view["decision"] in ("continue", "stop_a_better")
    # the logs give the same numbers for the same episodes
    offline = read_experiment([str(f) for f in p.log_dir.rglob("*.jsonl")], "disclosure")
    assert offline is not None
    assert offline["arms"] == view["arms"] and offline["difference"] == diff


def test_unknown_experiment_is_a_400_naming_it(proxy: ProxyFactory, default_proxy: Proxy) -> None:
    for p in (proxy(_config()), default_proxy):
        r = p.http().post("/v1/chat/completions", json=chat_body(),
                          headers={"X-Episode-Id": new_id(), "X-Episode-Experiment": "nope"})
        err = assert_openai_error(r, 400, "invalid_request", "experiment")
        assert "'nope'" in err["message"]
        assert_openai_error(p.http().get("/v1/experiments/nope"), 404, "experiment_not_found")
    r = proxy(_config()).http().post(
        "/v1/messages", json={"model": "m1", "max_tokens": 5,
                              "messages": [{"role": "user", "content": "hi"}]},
        headers={"X-Episode-Id": new_id(), "X-Episode-Experiment": "nope"})
    assert r.status_code == 400 and r.json()["type"] == "error"
    assert "'nope'" in r.json()["error"]["message"]


def test_unit_task_gives_a_task_one_arm_in_balanced_blocks(proxy: ProxyFactory) -> None:
    p = proxy(_config(unit="task", name="by-task"), fresh=True)
    seen: dict[str, set[str]] = {}
    for i in range(8):
        task = f"task-{i}"
        for _ in range(3):
            seen.setdefault(task, set()).add(
                run_episode(p, new_id(), "by-task", **{"X-Episode-Task": task}))
    assert all(len(arms) == 1 for arms in seen.values())
    firsts = [next(iter(seen[f"task-{i}"])) for i in range(8)]
    for block in range(4):  # every two new tasks: one of each arm
        assert sorted(firsts[2 * block: 2 * block + 2]) == ["hidden", "told-wrong"]


def test_unit_episode_splits_each_task_evenly(proxy: ProxyFactory) -> None:
    p = proxy(_config(name="by-episode"), fresh=True)
    for task in ("a", "b"):
        arms = [run_episode(p, new_id(), "by-episode", **{"X-Episode-Task": task})
                for _ in range(6)]
        assert arms.count("hidden") == 3


def test_auto_stop_assigns_the_winner_and_logs_the_decision(proxy: ProxyFactory) -> None:
    p = proxy(_config(stop="auto", name="disclosure"), fresh=True)
    decision = None
    for _ in range(200):
        eid = new_id()
        arm = run_episode(p, eid)
        report(p, eid, arm == "hidden")
        view = p.http().get("/v1/experiments/disclosure").json()
        if view["stopped"] is not None:
            decision = view["stopped"]
            break
        if view["decision"] != "continue":
            time.sleep(0.5)  # the sweep stops it
    assert decision == "stop_a_better"
    assert {run_episode(p, new_id()) for _ in range(6)} == {"hidden"}
    logged = p.wait_records(1, type="experiment_decision")
    assert len(logged) == 1 and logged[0]["decision"] == "stop_a_better"
    assert logged[0]["next_arm"] == "hidden"
    assert logged[0]["difference"]["cs_low"] > 0


def test_metrics_gauges_per_experiment_and_arm(proxy: ProxyFactory) -> None:
    p = proxy({**_config(), "metrics": {"enabled": True}})
    eid = new_id()
    report(p, eid, run_episode(p, eid) == "hidden")
    p.http().get("/v1/experiments/disclosure")
    text = p.http().get("/metrics").text
    assert 'budgetproxy_experiment_episodes{arm="hidden",experiment="disclosure"}' in text
    assert 'budgetproxy_experiment_difference{bound="cs_low",experiment="disclosure"}' in text
    assert 'budgetproxy_experiment_decision{decision="continue",experiment="disclosure"} 1.0' \
        in text


def _spend_episode(p: Proxy, experiment: str) -> tuple[str, str]:
    """One episode of two calls through the official client, the second as long as the arm
    says (so the arms spend differently); (episode id, arm)."""
    client, eid = p.client(), new_id()
    raw = client.chat.completions.with_raw_response.create(
        model="m1", messages=[{"role": "user", "content": "go"}],
        extra_headers={"X-Episode-Id": eid, "X-Episode-Experiment": experiment,
                       "X-Episode-Task": "t", "X-Episode-Max-Turns": "4"})
    arm = raw.headers["x-episode-arm"]
    words = " ".join(["on"] * (3 if arm == "hidden" else 30))
    client.chat.completions.create(
        model="m1", messages=[{"role": "user", "content": "go"},
                              {"role": "assistant", "content": "ok"},
                              {"role": "user", "content": words}],
        extra_headers={"X-Episode-Id": eid})
    return eid, arm


def _gauges(p: Proxy, name: str) -> dict[tuple[str, str], float]:
    """The experiment's estimate and difference gauges as /metrics gives them."""
    from prometheus_client.parser import text_string_to_metric_families

    found = {}
    for family in text_string_to_metric_families(p.http().get("/metrics").text):
        for s in family.samples:
            if s.labels.get("experiment") != name:
                continue
            if s.name == "budgetproxy_experiment_estimate":
                found["arm", s.labels["arm"]] = s.value
            elif s.name == "budgetproxy_experiment_difference":
                found["bound", s.labels["bound"]] = s.value
    return found


@pytest.mark.parametrize("metric", ["success", "reward", "tokens", "cost", "pass_at_tier"])
def test_the_api_the_gauges_and_analyze_agree(proxy: ProxyFactory, metric: str) -> None:
    """The metric's estimate per arm and the difference in its units: the API, the Prometheus
    gauges and `analyze --experiment` give the same numbers for the same episodes."""
    name = f"agree-{metric}"
    settings: dict[str, Any] = {"metric": metric, "name": name}
    if metric == "tokens":
        settings["metric_max"] = 60  # (the long arm's episodes spend more: clipped)
    if metric == "cost":
        settings.update(metric_max=0.06, min_effect=0.01)  # USD: $0.001 a token here
    if metric == "pass_at_tier":
        settings["tier"] = 25  # T = 1 of the episodes' 4 max turns
    p = proxy({**_config(**settings), "metrics": {"enabled": True},
               "budget": {"default_tokens": 100_000, "default_cost_usd": 100.0},
               "prices": {"m1": {"input_per_mtok": 1000.0, "output_per_mtok": 1000.0}}})
    arms: dict[str, str] = {}
    rewards = {"hidden": 0.8, "told-wrong": 1.7}  # (1.7: clipped to the range's 1)
    for i in range(8):
        eid, arm = _spend_episode(p, name)
        arms[eid] = arm
        r = p.http().post(f"/v1/episodes/{eid}/outcome",
                          json={"success": i % 3 != 0, "reward": rewards[arm] - 0.1 * (i % 2),
                                **({"success_turn": 1 + i % 2} if i % 3 else {})})
        assert r.status_code == 200, r.text
    api = p.http().get(f"/v1/experiments/{name}").json()
    assert api["metric"] == metric and sum(a["episodes"] for a in api["arms"]) == 8
    records = p.wait_records(8, type="episode", experiment=name)
    by_arm = {arm: [r for r in records if arms[r["episode_id"]] == arm] for arm in rewards}
    for a in api["arms"]:
        eps = by_arm[a["name"]]
        if metric in ("tokens", "cost"):  # what each episode spent, up to metric_max
            used, top = f"{metric}_used", settings["metric_max"]
            expected = sum(min(r[used], top) for r in eps) / len(eps)
            assert api["better"] == "lower" and api["metric_max"] == top
            assert a["clipped"] == sum(r[used] > top for r in eps)
        elif metric == "reward":
            expected = sum(min(r["reward"], 1.0) for r in eps) / len(eps)
            assert a["clipped"] == sum(r["reward"] > 1 for r in eps)
        elif metric == "pass_at_tier":  # success at turn 1 of T = 1
            expected = sum(r["success_turn"] == 1 for r in eps) / len(eps)
            assert api["tier"] == 25
        else:
            expected = sum(r["end_reason"] == "success" for r in eps) / len(eps)
        assert a["estimate"] == pytest.approx(expected)
    if metric in ("tokens", "cost"):
        hidden, told = (next(a for a in api["arms"] if a["name"] == n) for n in rewards)
        assert told["estimate"] > hidden["estimate"] > 0
    diff = api["difference"]
    width = api["metric_max"] - api["metric_min"]
    assert -width <= diff["cs_low"] <= diff["cs_high"] <= width

    out = subprocess.run([sys.executable, "-m", "budgetproxy", "analyze", str(p.log_dir),
                          "--experiment", name, "--json"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    import json

    offline = json.loads(out.stdout)
    for key in ("arms", "difference", "decision", "metric", "metric_min", "metric_max",
                "tier", "better"):
        assert offline[key] == api[key], key

    gauges = _gauges(p, name)  # (set by the GET above)
    for a in api["arms"]:
        assert gauges["arm", a["name"]] == pytest.approx(a["estimate"])
    for bound in ("estimate", "cs_low", "cs_high"):
        assert gauges["bound", bound] == pytest.approx(diff[bound])


@pytest.mark.parametrize("bad", [
    {"arms": [{"name": "only"}]},
    {"arms": [{"name": "a"}, {"name": "a"}]},
    {"arms": [{"name": "a b"}, {"name": "c"}]},
    {"alpha": 1.5},
    {"arms": [{"name": "a", "template": "{nope}"}, {"name": "b"}]},
])
def test_bad_experiment_config_names_the_key(bad: dict[str, Any]) -> None:
    from budgetproxy.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="experiments"):
        load_config(None, {"experiments": [{**EXPERIMENT, **bad}]})


@pytest.mark.parametrize(("bad", "key"), [
    ({"metric": "tokens"}, "experiments.0.metric_max: required for metric tokens"),
    ({"metric": "cost", "metric_min": 0.5}, "experiments.0.metric_max: required for metric cost"),
    ({"metric": "cost", "metric_min": -1, "metric_max": 1}, "experiments.0.metric_min"),
    ({"metric": "reward", "metric_min": 2}, "experiments.0.metric_max: must be above"),
    ({"metric": "reward", "metric_max": 10, "min_effect": 11}, "experiments.0.min_effect"),
    ({"metric": "pass_at_tier"}, "experiments.0.tier: required for metric pass_at_tier"),
    ({"metric": "pass_at_tier", "tier": 0}, "experiments.0.tier"),
    ({"metric": "pass_at_tier", "tier": 25, "metric_max": 3}, "experiments.0.metric_max"),
    ({"metric": "success", "tier": 25}, "experiments.0.tier: only for metric pass_at_tier"),
    ({"metric": "latency"}, "experiments.0.metric"),
])
def test_a_bad_metric_setting_names_its_key(bad: dict[str, Any], key: str) -> None:
    from budgetproxy.config import ConfigError, load_config

    with pytest.raises(ConfigError) as err:
        load_config(None, {"experiments": [{**EXPERIMENT, "min_effect": None, **bad}]})
    assert key in str(err.value)


def test_joining_by_the_episode_api(proxy: ProxyFactory) -> None:
    p = proxy(_config())
    seen = set()
    for _ in range(8):
        r = p.http().post("/v1/episodes", json={"experiment": "disclosure", "task_id": "t"})
        assert r.status_code == 201, r.text
        body = r.json()
        assert body["experiment"] == "disclosure"
        seen.add(body["arm"])
        assert body["disclosure"] == ("hidden" if body["arm"] == "hidden" else "disclosed")
        call = p.http().post(f"/episodes/{body['episode_id']}/v1/chat/completions",
                             json=chat_body())
        assert call.headers["x-episode-arm"] == body["arm"]
    assert seen == {"hidden", "told-wrong"}
    err = assert_openai_error(p.http().post("/v1/episodes", json={"experiment": "nope"}),
                              400, "invalid_request", "experiment")
    assert "'nope'" in err["message"]


def test_an_arm_with_a_model_calls_that_model(proxy: ProxyFactory) -> None:
    p = proxy({"experiments": [{"name": "models", "unit": "episode", "arms": [
        {"name": "asked"}, {"name": "other", "model": "other-model"}]}]})
    got: dict[str, set[str]] = {}
    for _ in range(10):
        eid = new_id()
        raw = p.client().chat.completions.with_raw_response.create(
            model="m1", messages=[{"role": "user", "content": "hi"}],
            extra_headers={"X-Episode-Id": eid, "X-Episode-Experiment": "models"})
        got.setdefault(raw.headers["x-episode-arm"], set()).add(raw.parse().model)
    assert got == {"asked": {"m1"}, "other": {"other-model"}}
    turns = p.wait_records(10, type="turn", experiment="models")
    assert {t["arm"]: t["model"] for t in turns} == {"asked": "m1", "other": "other-model"}
