"""`probe --over FIELD`: each checkpoint's win rates against a fixed reference (--b), in
checkpoint order, with intervals and few_tasks; logs from a real proxy, actions sampled
through it by the official client."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from conftest import read_jsonl

from budgetproxy.cli import main
from budgetproxy.client import BudgetClient
from budgetproxy.config import load_config
from budgetproxy.serve.server import ProxyServer
from budgetproxy.testing import FakeUpstream

TASKS = ("t1", "t2", "t3")
STEPS = ("100", "0", "10", "2")  # logged out of order; "0" is the reference


class LabelledUpstream(FakeUpstream):
    """Answers every chat call with the model's name."""

    def _chat_answer(self, request: web.Request, req: dict[str, Any]
                     ) -> tuple[str | None, list[dict[str, Any]]]:
        return f"model={req.get('model')}", []


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ProxyServer, Path]]:
    """Per training step (model m-<step>), two finished two-turn episodes per task."""
    logs = tmp_path_factory.mktemp("over-logs")
    up = LabelledUpstream(models=[f"m-{s}" for s in STEPS]).start()
    config = load_config(None, {"upstreams": [{"name": "lab", "base_url": up.base_url}],
                                "trajectories": {"dir": str(logs)},
                                "metrics": {"enabled": False}})
    server = ProxyServer(config).start()
    with BudgetClient(server.url) as api:
        for step in STEPS:
            for task in TASKS:
                for _ in range(2):
                    ep = api.create_episode(budget=4, max_turns=4, task_id=task,
                                            tags={"step": step, "run": "train"})
                    llm = ep.openai(max_retries=0)
                    messages: list[dict[str, Any]] = [{"role": "user", "content": f"do {task}"}]
                    for _ in range(2):
                        llm.chat.completions.create(model=f"m-{step}", messages=messages)  # type: ignore[arg-type]
                        messages += [{"role": "assistant", "content": "ok"},
                                     {"role": "user", "content": "continue"}]
                    ep.report(success=True)
    deadline = time.monotonic() + 10
    while sum(r["type"] == "episode" for r in read_jsonl(logs)) < len(STEPS) * 6:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    yield server, logs
    server.stop()
    up.stop()


def test_over_gives_each_checkpoint_against_the_reference_in_order(
    setup: tuple[ProxyServer, Path], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    server, logs = setup
    report = tmp_path / "over.html"
    code = main(["probe", str(logs), "--proxy", server.url, "--over", "step", "--b", "step=0",
                 "--a", "run=train", "--scorer", "probe_scorers:by_step", "--states", "12",
                 "--samples", "2", "--json", "--report", str(report)])
    out, err = capsys.readouterr()
    assert code == 0, err
    result = json.loads(out)
    points = result["over"]
    # the reference (step 0) is no checkpoint; the rest in numeric order
    assert [p["value"] for p in points] == ["2", "10", "100"]
    assert [p["model"] for p in points] == ["m-2", "m-10", "m-100"]
    assert result["settings"]["reference"] == "step=0" and result["settings"]["over"] == "step"
    # by hand: the reference never scores; checkpoint s scores on the tasks whose bar it
    # reaches (t1: 1, t2: 5, t3: 50), and states are spread evenly over the three tasks
    for point, share in zip(points, (1 / 3, 2 / 3, 1.0), strict=True):
        single = point["single_step"]
        assert single["n_states"] == 12 and single["n_tasks"] == 3
        assert single["win_rate"] == pytest.approx(share)
        assert single["tie_rate"] == pytest.approx(1 - share)
        assert single["ci_low"] <= share <= single["ci_high"]
        assert single["few_tasks"] is True  # three tasks
        assert point["error_states"]["n_states"] == 0  # no --inject, no error pattern
    assert (points[0]["single_step"]["ci_low"], points[0]["single_step"]["ci_high"]) == (0.0,
                                                                                         1.0)
    assert (points[2]["single_step"]["ci_low"], points[2]["single_step"]["ci_high"]) == (1.0,
                                                                                         1.0)
    page = report.read_text(encoding="utf-8")
    assert "State diagnostics per checkpoint (step)" in page and "checkpoint (step)" in page


def test_over_text_and_usage(setup: tuple[ProxyServer, Path],
                             capsys: pytest.CaptureFixture[str]) -> None:
    server, logs = setup
    code = main(["probe", str(logs), "--proxy", server.url, "--over", "step", "--b", "step=0",
                 "--scorer", "probe_scorers:by_step", "--states", "6", "--samples", "1"])
    out, _ = capsys.readouterr()
    assert code == 0
    rows = [line.split()[0] for line in out.splitlines()[2:5]]
    assert rows == ["2", "10", "100"]
    assert "100.0% [100.0, 100.0] †" in out and "fewer than 10 tasks" in out
    assert main(["probe", str(logs), "--proxy", server.url, "--b", "step=0",
                 "--scorer", "probe_scorers:by_step"]) == 2
    assert "--a is required" in capsys.readouterr().err
    assert main(["probe", str(logs), "--proxy", server.url, "--over", "nothing", "--b",
                 "step=0", "--scorer", "probe_scorers:by_step"]) == 2
    assert "no episode beside the reference" in capsys.readouterr().err
