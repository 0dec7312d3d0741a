"""The live-experiments dashboard against a real Prometheus scraping a proxy with an experiment:
every panel returns data, and the interval it draws is the one the API gives."""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from prometheus_support import (
    EXPERIMENTS_BOARD,
    PanelQuery,
    Prometheus,
    Proxy,
    panel_queries,
    substitute,
    wait_until,
)

from budgetproxy.testing import FakeUpstream

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]

QUERIES = [q for q in panel_queries() if q.dashboard == EXPERIMENTS_BOARD]
CONFIG = """\
episodes: {sweep_interval_s: 0.2}
experiments:
  - name: told
    unit: episode
    min_effect: 0.3
    arms:
      - {name: hidden, disclosure: hidden}
      - {name: disclosed, disclosure: disclosed}
"""


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Prometheus, dict[str, Any]]]:
    workdir: Path = tmp_path_factory.mktemp("prometheus-experiments")
    with FakeUpstream(models=["m"]) as upstream:
        config = workdir / "proxy.yaml"
        config.write_text(CONFIG)
        proxy = Proxy(workdir, upstream.base_url, "--config", str(config)).start()
        prom: Prometheus | None = None
        try:
            prom = Prometheus(workdir, [f"127.0.0.1:{proxy.port}"]).start()
            wait_until(prom.targets_up, 30, "Prometheus's first successful scrape of the proxy")
            client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="test", max_retries=0)
            with httpx.Client(base_url=proxy.url, timeout=30) as http:
                for i in range(12):
                    eid = f"ep-{uuid.uuid4().hex[:8]}"
                    raw = client.chat.completions.with_raw_response.create(
                        model="m", messages=[{"role": "user", "content": "hi"}],
                        extra_headers={"X-Episode-Id": eid, "X-Episode-Experiment": "told",
                                       "X-Episode-Task": f"t{i % 2}"})
                    arm = raw.headers["x-episode-arm"]
                    assert http.post(f"/v1/episodes/{eid}/outcome",
                                     json={"success": arm == "hidden"}).status_code == 200
                time.sleep(0.5)  # the sweep refreshes the gauges
                view = http.get("/v1/experiments/told").json()
            client.close()

            def scraped() -> bool:
                got = prom.query('sum(budgetproxy_experiment_episodes{experiment="told"})')
                return bool(got) and round(float(got[0]["value"][1])) == 12

            wait_until(scraped, 30, "Prometheus to scrape 12 experiment episodes", 0.5)
            yield prom, view
        finally:
            if prom is not None:
                prom.stop()
            proxy.stop()


@pytest.mark.parametrize("query", QUERIES, ids=[q.name for q in QUERIES])
def test_panel_query_returns_data(run: tuple[Prometheus, dict[str, Any]],
                                  query: PanelQuery) -> None:
    prom, _ = run
    expr = substitute(query.target["expr"])
    result = prom.query(expr)
    assert result, f"{query.name} returned no data:\n{expr}"
    assert not any(math.isnan(float(r["value"][1])) for r in result), result


def test_the_drawn_interval_is_the_apis(run: tuple[Prometheus, dict[str, Any]]) -> None:
    prom, view = run
    panel = next(q for q in QUERIES if q.panel["title"].startswith("First arm"))
    drawn = {}
    for t in panel.panel["targets"]:
        result = prom.query(substitute(t["expr"]))
        drawn[t["legendFormat"].split()[-1]] = float(result[0]["value"][1])
    diff = view["difference"]
    assert drawn["cs_low"] == pytest.approx(diff["cs_low"])
    assert drawn["cs_high"] == pytest.approx(diff["cs_high"])
    assert drawn["estimate"] == pytest.approx(diff["estimate"])
    decision = next(q for q in QUERIES if q.panel["title"] == "Decision")
    result = prom.query(substitute(decision.target["expr"]))
    assert [r["metric"]["decision"] for r in result] == [view["decision"]]
