"""Every dashboard panel, evaluated by a real Prometheus scraping the real proxy under known load.

The proxy (`python -m budgetproxy serve`) runs in front of the fake upstream; the official
`openai` client plays episodes at known tiers and arms, reports their outcomes, and spends some
budgets; Prometheus scrapes every second. Then each panel's query (variables substituted) must
return data, and the numbers that matter must equal what was sent.
"""

from __future__ import annotations

import math
import re
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from prometheus_support import (
    EXPERIMENTS_BOARD,
    HISTOGRAMS,
    METRICS,
    PanelQuery,
    Prometheus,
    Proxy,
    panel_queries,
    promtool,
    substitute,
    wait_until,
)

from budgetproxy.testing import FakeUpstream

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]

MODEL = "fake-model"
CHAT = "/v1/chat/completions"
# USD per million tokens for the fake model (config `prices`): an episode's cost is its usage
# priced at these rates, so the success-within-B-dollars panel's value is known exactly.
PRICE_IN, PRICE_OUT = 1000.0, 3000.0
# (the experiments board runs on a proxy with an experiment: test_prometheus_experiments.py)
QUERIES = [q for q in panel_queries() if q.dashboard != EXPERIMENTS_BOARD]
# Panels that may rightly be empty after this run, and why.
MAY_BE_EMPTY = {
    "Store unavailable": "the in-memory store is never unavailable",
}


@dataclass(frozen=True)
class Episode:
    """One scripted episode: `turns` model calls, then an outcome report (or none)."""

    name: str
    budget: int
    max_turns: int | None
    arm: str
    turns: int
    end: str  # success | failure | end (no report) | active (left running)
    success_turn: int | None = None
    refused: bool = False  # one more call once the budget is spent: 403
    stream_last: bool = False
    cost_budget: bool = False  # a cost budget it never reaches: its cost is in the histogram

    @property
    def tier(self) -> str:
        if self.max_turns is None:
            return "n/a"
        return f"{round(self.budget / self.max_turns * 20) * 5}%"

    @property
    def end_reason(self) -> str | None:
        """The contract's precedence: success > exhausted > failure > abandoned."""
        if self.end == "active":
            return None
        if self.end == "success":
            return "success"
        if self.refused or self.turns >= self.budget:
            return "exhausted"
        return "failure" if self.end == "failure" else "abandoned"

    @property
    def observed_turns(self) -> int:
        """What the episode_turns histogram records: success_turn for successes."""
        if self.end_reason == "success" and self.success_turn is not None:
            return self.success_turn
        return self.turns


FIRST = [
    Episode("h25-a", 5, 20, "hidden", 3, "success", 2, cost_budget=True),
    Episode("h25-b", 5, 20, "hidden", 5, "success", 5, cost_budget=True),
    Episode("h25-c", 5, 20, "hidden", 5, "failure", refused=True, cost_budget=True),
    Episode("h25-d", 5, 20, "hidden", 2, "failure"),
    Episode("h25-e", 5, 20, "hidden", 1, "end"),
    Episode("d25-a", 5, 20, "disclosed", 4, "success", 4),
    Episode("d25-b", 5, 20, "disclosed", 5, "failure", refused=True),
    Episode("d25-c", 5, 20, "disclosed", 5, "failure"),
    Episode("h100-a", 20, 20, "hidden", 8, "success", 8, cost_budget=True),
    Episode("h100-b", 20, 20, "hidden", 12, "success", 10, cost_budget=True),
    Episode("h100-c", 20, 20, "hidden", 4, "failure"),
    Episode("h100-live", 20, 20, "hidden", 1, "active"),
    Episode("d100-a", 20, 20, "disclosed", 6, "success", 6, stream_last=True,
            cost_budget=True),
    Episode("d100-b", 20, 20, "disclosed", 3, "failure"),
    Episode("hna-a", 3, None, "hidden", 1, "success", 1),
]
# Played after Prometheus has scraped the first batch: the time-range panels, with the range
# starting between the two, must count these alone (new series and grown ones).
SECOND = [
    Episode("h25-f", 5, 20, "hidden", 2, "success", 1),
    Episode("h25-g", 5, 20, "hidden", 3, "failure"),
    Episode("d25-d", 5, 20, "disclosed", 5, "failure", refused=True),
    Episode("h50-a", 10, 20, "hidden", 3, "success", 3),
]
EPISODES = FIRST + SECOND
ARMS = sorted({(e.tier, e.arm) for e in EPISODES})
FINISHED = [e for e in EPISODES if e.end_reason is not None]
# Extra calls with no episode: (extra headers, expected HTTP status).
LOOSE_CALLS = [
    ({}, 200),
    ({}, 200),
    ({"X-Fake-Status": "500"}, 500),
    ({"X-Fake-Status": "429"}, 429),
]


def judged(tier: str, arm: str, among: list[Episode] = EPISODES) -> list[Episode]:
    return [
        e
        for e in among
        if (e.tier, e.arm) == (tier, arm) and e.end_reason not in (None, "abandoned")
    ]


def success_within(tier: str, arm: str, t: int, among: list[Episode] = EPISODES) -> float:
    eps = judged(tier, arm, among)
    return sum(e.end_reason == "success" and e.observed_turns <= t for e in eps) / len(eps)


def share(tier: str, arm: str, reason: str, among: list[Episode] = EPISODES) -> float:
    eps = judged(tier, arm, among)
    return sum(e.end_reason == reason for e in eps) / len(eps)


@dataclass
class Run:
    prom: Prometheus
    proxy: Proxy
    tag: str = ""  # prefix of this run's episode ids
    at: float = 0.0  # evaluation time: after the last scrape of the final state
    second_range: str = ""  # a range starting after FIRST was scraped, before SECOND began
    usage: Counter[str] = field(default_factory=Counter)
    chat_calls: int = 0
    cost: dict[str, float] = field(default_factory=dict)  # USD per episode, as the proxy sums

    def spend(self, ep: Episode | None, prompt: int, completion: int) -> None:
        """One call's usage; priced for its episode (None: a call without one)."""
        self.usage["input"] += prompt
        self.usage["output"] += completion
        if ep is not None:
            call = prompt * PRICE_IN / 1e6 + completion * PRICE_OUT / 1e6
            self.cost[ep.name] = self.cost.get(ep.name, 0.0) + call

    def panel(self, title: str, ref: str = "A") -> PanelQuery:
        found = [q for q in QUERIES if q.panel["title"] == title and q.target["refId"] == ref]
        assert len(found) == 1, f"no single panel {title!r} / {ref}"
        return found[0]

    def evaluate(self, title: str, ref: str = "A", **values: str) -> list[dict[str, Any]]:
        return self.prom.query(substitute(self.panel(title, ref).target["expr"], values), self.at)

    def by(self, title: str, *labels: str, **values: str) -> dict[tuple[str, ...], float]:
        result = self.evaluate(title, **values)
        out = {tuple(r["metric"].get(k, "") for k in labels): float(r["value"][1]) for r in result}
        assert len(out) == len(result), f"{title}: labels {labels} do not identify its series"
        return out

    def scalar(self, title: str, **values: str) -> float:
        result = self.evaluate(title, **values)
        assert len(result) == 1, f"{title}: {result}"
        return float(result[0]["value"][1])


def _play(client: openai.OpenAI, http: httpx.Client, ep: Episode, run: Run, tag: str) -> None:
    eid = f"{tag}-{ep.name}"
    headers = {
        "X-Episode-Id": eid,
        "X-Episode-Budget": str(ep.budget),
        "X-Episode-Disclosure": ep.arm,
        # a token budget no episode reaches: the spend-per-episode families are exported
        "X-Episode-Token-Budget": "1000000",
    }
    if ep.cost_budget:
        headers["X-Episode-Cost-Budget"] = "10"
    if ep.max_turns is not None:
        headers["X-Episode-Max-Turns"] = str(ep.max_turns)
    messages: list[Any] = [{"role": "system", "content": "You solve the task step by step."}]
    for n in range(1, ep.turns + 1):
        # Every turn's body differs, so no call is taken for a free retry of the previous one.
        messages.append({"role": "user", "content": f"{eid}: observation {n}"})
        run.chat_calls += 1
        if ep.stream_last and n == ep.turns:
            stream = client.chat.completions.create(
                model=MODEL,
                messages=messages,
                stream=True,
                stream_options={"include_usage": True},
                extra_headers=headers,
            )
            text = ""
            for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    text += chunk.choices[0].delta.content
                if chunk.usage is not None:
                    run.spend(ep, chunk.usage.prompt_tokens, chunk.usage.completion_tokens)
        else:
            resp = client.chat.completions.create(
                model=MODEL, messages=messages, extra_headers=headers
            )
            assert resp.usage is not None
            run.spend(ep, resp.usage.prompt_tokens, resp.usage.completion_tokens)
            text = resp.choices[0].message.content or ""
        messages.append({"role": "assistant", "content": text})
    if ep.refused:
        messages.append({"role": "user", "content": f"{eid}: one more"})
        run.chat_calls += 1
        with pytest.raises(openai.PermissionDeniedError) as refused:
            client.chat.completions.create(model=MODEL, messages=messages, extra_headers=headers)
        assert refused.value.code == "turn_budget_exhausted"
    if ep.end in ("success", "failure"):
        report: dict[str, Any] = {"success": ep.end == "success"}
        if ep.success_turn is not None:
            report["success_turn"] = ep.success_turn
        answer = http.post(f"/v1/episodes/{eid}/outcome", json=report)
        assert answer.status_code == 200, answer.text
    elif ep.end == "end":
        answer = http.post(f"/v1/episodes/{eid}/end")
        assert answer.status_code == 200, answer.text


def _loose_calls(client: openai.OpenAI, run: Run) -> None:
    for i, (headers, status) in enumerate(LOOSE_CALLS):
        run.chat_calls += 1
        messages: list[Any] = [{"role": "user", "content": f"no episode {i}"}]
        if status == 200:
            resp = client.chat.completions.create(
                model=MODEL, messages=messages, extra_headers=headers
            )
            assert resp.usage is not None
            run.spend(None, resp.usage.prompt_tokens, resp.usage.completion_tokens)
        else:
            with pytest.raises(openai.APIStatusError) as failed:
                client.chat.completions.create(
                    model=MODEL, messages=messages, extra_headers=headers
                )
            assert failed.value.status_code == status


def _wait_for_scrape(prom: Prometheus, played: list[Episode], chat_calls: int) -> None:
    """Until Prometheus has scraped the proxy after all of `played` and `chat_calls`."""
    expected = (sum(e.end_reason is not None for e in played), chat_calls)
    final = (
        "sum(budgetproxy_episodes_finished_total)",
        f'sum(budgetproxy_requests_total{{route="{CHAT}"}})',
    )

    def scraped() -> bool:
        got = (sum(float(r["value"][1]) for r in prom.query(q)) for q in final)
        return tuple(round(v) for v in got) == expected

    wait_until(scraped, 30, f"Prometheus to scrape (finished, chat calls) = {expected}", 0.5)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    workdir: Path = tmp_path_factory.mktemp("prometheus-dashboards")
    with FakeUpstream(models=[MODEL]) as upstream:
        # Tracing on, exporting to the fake upstream (it takes OTLP/HTTP too), so the trace
        # panel has data; spans leave in batches every 200 ms.
        config = workdir / "proxy.yaml"
        config.write_text("server: {forward_headers: [x-fake-*]}\n"
                          f"prices: {{{MODEL}: {{input_per_mtok: {PRICE_IN}, "
                          f"output_per_mtok: {PRICE_OUT}}}}}\n")
        proxy = Proxy(workdir, upstream.base_url, "--config", str(config), env={
            "OTEL_EXPORTER_OTLP_ENDPOINT": upstream.base_url.rsplit("/v1", 1)[0],
            "OTEL_BSP_SCHEDULE_DELAY": "200"}).start()
        prom: Prometheus | None = None
        try:
            prom = Prometheus(workdir, [f"127.0.0.1:{proxy.port}"]).start()
            wait_until(prom.targets_up, 30, "Prometheus's first successful scrape of the proxy")
            result = Run(prom, proxy)
            client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="test", max_retries=0)
            result.tag = uuid.uuid4().hex[:8]
            with httpx.Client(base_url=proxy.url, timeout=30) as http:
                for ep in FIRST:
                    _play(client, http, ep, result, result.tag)
                _wait_for_scrape(prom, FIRST, result.chat_calls)
                between = time.time()
                time.sleep(0.2)
                for ep in SECOND:
                    _play(client, http, ep, result, result.tag)
                _loose_calls(client, result)
            client.close()
            _wait_for_scrape(prom, EPISODES, result.chat_calls)
            # Two more scrapes so every rate() window holds the final samples.
            time.sleep(2.5)
            result.at = time.time()
            result.second_range = f"{int((result.at - between) * 1000)}ms"
            yield result
        finally:
            if prom is not None:
                prom.stop()
            proxy.stop()


# ---- every panel returns data ----------------------------------------------------------------


@pytest.mark.parametrize("query", QUERIES, ids=[q.name for q in QUERIES])
def test_panel_query_returns_data(run: Run, query: PanelQuery) -> None:
    expr = substitute(query.target["expr"])
    title = query.panel["title"]
    result = run.prom.query(expr, run.at)
    if title in MAY_BE_EMPTY:
        return
    assert result, f"{query.name} returned no data:\n{expr}"
    values = [float(r["value"][1]) for r in result]
    if "histogram_quantile" not in expr:
        assert not any(math.isnan(v) for v in values), f"{query.name}: NaN in {result}"
    if query.panel["fieldConfig"]["defaults"].get("unit") == "percentunit":
        assert all(-1 <= v <= 1 for v in values), f"{query.name}: {values}"
    if query.target["range"]:
        series = run.prom.query_range(expr, run.at - 60, run.at, "5s")
        assert series, f"{query.name} returned no series over the last minute"


# ---- the numbers match what was sent ---------------------------------------------------------


def test_success_rate_per_tier_and_arm(run: Run) -> None:
    got = run.by("Success rate by tier and arm", "tier", "disclosure")
    assert got == pytest.approx({(t, a): share(t, a, "success") for t, a in ARMS})
    for tier, arm in ARMS:
        one = run.scalar("Success rate", tier=tier, arm=arm)
        assert one == pytest.approx(share(tier, arm, "success")), (tier, arm)
    all_judged = [e for e in FINISHED if e.end_reason != "abandoned"]
    overall = sum(e.end_reason == "success" for e in all_judged) / len(all_judged)
    assert run.scalar("Success rate") == pytest.approx(overall)


def test_success_rate_over_time_ends_at_the_totals(run: Run) -> None:
    got = run.by("Success rate over time by tier and arm", "tier", "disclosure")
    assert got == pytest.approx({(t, a): share(t, a, "success") for t, a in ARMS})


def test_disclosed_minus_hidden(run: Run) -> None:
    got = run.by("Disclosed − hidden success rate by tier", "tier")
    tiers = {t for t, a in ARMS if (t, "hidden") in ARMS and (t, "disclosed") in ARMS}
    assert got == pytest.approx(
        {(t,): share(t, "disclosed", "success") - share(t, "hidden", "success") for t in tiers}
    )


def test_live_pass_at_t_curve(run: Run) -> None:
    result = run.evaluate("Live Pass@T curve: success within T turns")
    curves: dict[str, dict[int, float]] = {}
    for r in result:
        le = r["metric"]["le"]
        assert float(le) == int(float(le)), le
        curves.setdefault(r["metric"]["series"], {})[int(float(le))] = float(r["value"][1])
    assert set(curves) == {f"{t} · {a}" for t, a in ARMS}
    for tier, arm in ARMS:
        curve = curves[f"{tier} · {arm}"]
        assert sorted(curve) == list(range(1, 65)), "one point per whole turn 1..64"
        assert curve == pytest.approx({t: success_within(tier, arm, t) for t in range(1, 65)})


def test_the_docs_pass_at_t_query(run: Run) -> None:
    """docs/metrics.md's PromQL for a pooled Pass@(1,T), run as printed (T = 8) and with
    other bucket bounds, gives success within T over the finished, non-abandoned episodes."""
    readme = (Path(__file__).resolve().parents[2] / "docs" / "metrics.md").read_text()
    blocks = re.findall(r"```promql\n(.*?)```", readme, re.S)
    (query,) = [b for b in blocks if "episode_turns_bucket" in b]
    assert 'le="8.0"' in query
    for t in (1, 4, 8, 20):
        got = {(r["metric"]["tier"], r["metric"]["disclosure"]): float(r["value"][1])
               for r in run.prom.query(query.replace('le="8.0"', f'le="{t}.0"'), run.at)}
        assert got == pytest.approx({(tier, arm): success_within(tier, arm, t)
                                     for tier, arm in ARMS}), t


def test_success_within_b_tokens(run: Run) -> None:
    """Every episode spends a few dozen tokens: within 100,000 is every success, as within
    every turn; within 1,000 too (the fake's echo is short)."""
    got = run.by("Success within B tokens (chosen B)", "tier", "disclosure", "le",
                 tokens="1000|100000")
    want = {(t, a, le): success_within(t, a, 64) for t, a in ARMS
            for le in ("1000.0", "100000.0")}
    assert got == pytest.approx(want)


def test_success_within_b_seconds(run: Run) -> None:
    """Every episode of the load ends within seconds of its first call: within 60 s and
    within 600 s is every success, as within every turn."""
    got = run.by("Success within B seconds (chosen B)", "tier", "disclosure", "le",
                 seconds="60|600")
    want = {(t, a, le): success_within(t, a, 64) for t, a in ARMS for le in ("60.0", "600.0")}
    assert got == pytest.approx(want)


def test_success_within_b_dollars(run: Run) -> None:
    """Successes with a cost budget whose whole cost (priced from their usage at the configured
    rates, up to their report) is at most B, over the judged episodes with a cost budget of
    the tier and arm (an episode whose cost was not measured is in neither); a tier and arm
    with no cost budget anywhere has no series, not a 0."""
    bounds = (0.025, 0.1, 0.25, 1)  # as the dashboard's variable writes them
    got = run.by("Success within B dollars (chosen B)", "tier", "disclosure", "le",
                 cost="|".join(map(str, bounds)))
    want = {}
    for tier, arm in ARMS:
        priced = [e for e in judged(tier, arm) if e.cost_budget]
        won = [e for e in priced if e.end_reason == "success"]
        if won:
            for b in bounds:
                assert all(abs(run.cost[e.name] - b) > 1e-9 for e in won), "cost on a bound"
                want[(tier, arm, b)] = sum(run.cost[e.name] <= b for e in won) / len(priced)
    assert {(t, a, float(le)): v for (t, a, le), v in got.items()} == pytest.approx(want)
    # the bounds split the load: some successes cost more than the lowest, all fit the highest
    assert len({round(v, 9) for (t, a, b), v in want.items() if (t, a) == ("25%", "hidden")}) > 1
    assert want[("25%", "hidden", 1)] == pytest.approx(2 / 3)  # h25-c failed
    assert "budgetproxy_episode_cost_usd_bucket" in run.panel(
        "Success within B dollars (chosen B)").target["expr"]


@pytest.mark.parametrize("title", ["Success within T (chosen T)", "Success within T over time"])
def test_success_within_chosen_t(run: Run, title: str) -> None:
    ts = (1, 2, 4, 5, 8, 10, 20)
    got = run.by(title, "tier", "disclosure", "le", turns="|".join(map(str, ts)))
    want = {(t, a, f"{x}.0"): success_within(t, a, x) for t, a in ARMS for x in ts}
    normalised = {(t, a, f"{float(le):.1f}"): v for (t, a, le), v in got.items()}
    assert normalised == pytest.approx(want)


def test_exhaustion(run: Run) -> None:
    got = run.by("Exhaustion rate by tier and arm", "tier", "disclosure")
    assert got == pytest.approx({(t, a): share(t, a, "exhausted") for t, a in ARMS})
    refusals = sum(e.refused for e in EPISODES)
    assert run.scalar("Budget refusals") == refusals
    for tier, arm in ARMS:
        want = sum(e.refused for e in EPISODES if (e.tier, e.arm) == (tier, arm))
        assert run.scalar("Budget refusals", tier=tier, arm=arm) == want, (tier, arm)
        assert run.scalar("Exhaustion rate", tier=tier, arm=arm) == pytest.approx(
            share(tier, arm, "exhausted")
        )


def test_turn_and_episode_counts(run: Run) -> None:
    assert run.scalar("Turns forwarded") == sum(e.turns for e in EPISODES)
    assert run.scalar("Episodes finished") == len(FINISHED)
    assert run.scalar("Active episodes") == sum(e.end == "active" for e in EPISODES)
    for tier, arm in ARMS:
        mine = [e for e in EPISODES if (e.tier, e.arm) == (tier, arm)]
        assert run.scalar("Turns forwarded", tier=tier, arm=arm) == sum(e.turns for e in mine)
        finished = sum(e.end_reason is not None for e in mine)
        assert run.scalar("Episodes finished", tier=tier, arm=arm) == finished
    started = run.prom.query("sum by (tier, disclosure) (budgetproxy_episodes_started_total)")
    assert {
        (r["metric"]["tier"], r["metric"]["disclosure"]): float(r["value"][1]) for r in started
    } == Counter((e.tier, e.arm) for e in EPISODES)


def test_outcomes_over_time_add_up(run: Run) -> None:
    got = run.by("Outcomes over time", "outcome", __interval="10m")
    assert got == Counter((e.end_reason,) for e in FINISHED)


def test_turns_per_episode_distribution(run: Run) -> None:
    # Prometheus returns the cumulative buckets; Grafana's heatmap format de-accumulates them.
    got = run.by("Turns per episode distribution", "le")
    assert len(got) == 65, "a bucket per whole turn 1..64, and +Inf"
    for (le,), count in got.items():
        bound = math.inf if le == "+Inf" else float(le)
        assert count == sum(e.observed_turns <= bound for e in FINISHED), le
    means = run.by("Mean turns per episode", "tier", "disclosure", "outcome")
    groups: dict[tuple[str, str, str], list[int]] = {}
    for e in FINISHED:
        assert e.end_reason is not None
        groups.setdefault((e.tier, e.arm, e.end_reason), []).append(e.observed_turns)
    assert means == pytest.approx({k: sum(v) / len(v) for k, v in groups.items()})


def test_proxy_health_breakdowns(run: Run) -> None:
    requests = run.by("Requests by route and status", "route", "code")
    codes = {code for route, code in requests if route == CHAT}
    assert {"200", "403", "429", "500"} <= codes, requests
    routes = {route for route, _ in requests}
    assert any(re.fullmatch(r"/v1/episodes/\{\w+\}/outcome", r) for r in routes), routes
    assert not any(run.tag in r for r in routes), f"a route label holds an episode id: {routes}"
    errors = run.by("Upstream errors by class", "upstream", "class")
    assert {("default", "status_5xx"), ("default", "status_429")} <= set(errors), errors
    ttft = run.by("Time to first token", "model")
    assert (MODEL,) in ttft
    assert ("/v1/chat/completions",) in run.by("Calls without an episode", "route")
    tokens = run.by("Tokens in the time range", "model", "direction")
    assert tokens == {(MODEL, "input"): run.usage["input"], (MODEL, "output"): run.usage["output"]}
    # rate() cannot see a series' first increment, and each status appeared once here: the 5xx
    # share is only checked to evaluate to a number.
    assert 0 <= run.scalar("5xx share") <= 1


def test_every_forwarded_call_left_as_a_span(run: Run) -> None:
    spans = {r["metric"]["result"]: float(r["value"][1])
             for r in run.prom.query("budgetproxy_trace_spans_total", at=run.at)}
    forwarded = run.prom.value("sum(budgetproxy_upstream_duration_seconds_count)")
    assert spans == {"exported": forwarded, "failed": 0.0, "dropped": 0.0}
    assert ("exported",) in run.by("Trace spans", "result")


def test_time_range_counts_only_what_happened_inside_it(run: Run) -> None:
    window = {"__range": run.second_range}
    arms = sorted({(e.tier, e.arm) for e in SECOND})
    assert run.scalar("Episodes finished", **window) == len(SECOND)
    assert run.scalar("Turns forwarded", **window) == sum(e.turns for e in SECOND)
    assert run.scalar("Budget refusals", **window) == sum(e.refused for e in SECOND)
    got = run.by("Success rate by tier and arm", "tier", "disclosure", **window)
    assert got == pytest.approx({(t, a): share(t, a, "success", SECOND) for t, a in arms})
    got = run.by("Success within T (chosen T)", "tier", "disclosure", "le", turns="1|3", **window)
    assert {(t, a, float(le)): v for (t, a, le), v in got.items()} == pytest.approx(
        {(t, a, float(x)): success_within(t, a, x, SECOND) for t, a in arms for x in (1, 3)}
    )
    outcomes = run.by("Outcomes over time", "outcome", __interval=run.second_range)
    assert {k: v for k, v in outcomes.items() if v} == Counter((e.end_reason,) for e in SECOND)


def test_exported_series_carry_the_contract_labels(run: Run) -> None:
    series = run.prom.query('{__name__=~"budgetproxy_.+"}', run.at)
    seen: dict[str, set[str]] = {}
    for s in series:
        labels = dict(s["metric"])
        name = labels.pop("__name__")
        if name.endswith("_created"):
            continue
        base = name
        for suffix in ("_bucket", "_sum", "_count"):
            if name.endswith(suffix) and name[: -len(suffix)] in HISTOGRAMS:
                base = name[: -len(suffix)]
        keys = set(labels) - {"job", "instance"}
        if name.endswith("_bucket"):
            assert "le" in keys, name
            keys.discard("le")
        assert base in METRICS, f"{name} is not among the metrics the dashboards know"
        assert keys == METRICS[base], f"{name} has labels {sorted(keys)}"
        seen.setdefault(base, set())
    missing = set(METRICS) - set(seen) - {"budgetproxy_store_unavailable_total"} - {
        m for m in METRICS if m.startswith("budgetproxy_experiment_")}  # (none configured)
    assert not missing, f"never exported under this load: {sorted(missing)}"
    les = {
        float(s["metric"]["le"])
        for s in series
        if s["metric"]["__name__"] == "budgetproxy_episode_turns_bucket"
    }
    assert les == {float(t) for t in range(1, 65)} | {math.inf}


def test_promtool_accepts_the_metrics_endpoint(run: Run) -> None:
    text = run.proxy.metrics_text()
    # The contract writes bucket bounds as floats.
    assert re.search(r'budgetproxy_episode_turns_bucket\{[^}]*le="5\.0"', text)
    result = promtool("check", "metrics", stdin=text)
    assert result.returncode == 0, result.stdout + result.stderr
