"""`budgetproxy probe` end to end: logs written by a real proxy, next actions sampled through
it by the real openai client, scored by loaded scorers; probe calls spend no budget."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
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


class LabelledUpstream(FakeUpstream):
    """Answers every chat call with the model's name, so a scorer can tell A from B."""

    def _chat_answer(self, request: web.Request, req: dict[str, Any]
                     ) -> tuple[str | None, list[dict[str, Any]]]:
        return f"model={req.get('model')}", []


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ProxyServer, Path]]:
    """A proxy in front of the labelled upstream, and logs of A (m-a) and B (m-b): two
    finished episodes per task each, three turns, each turn after the first with a tool result."""
    logs = tmp_path_factory.mktemp("probe-logs")
    up = LabelledUpstream(models=["m-a", "m-b"]).start()
    config = load_config(None, {"upstreams": [{"name": "lab", "base_url": up.base_url}],
                                "trajectories": {"dir": str(logs)},
                                "metrics": {"enabled": False}})
    server = ProxyServer(config).start()
    with BudgetClient(server.url) as api:
        for policy, model in (("A", "m-a"), ("B", "m-b")):
            for task in TASKS:
                for _ in range(2):
                    ep = api.create_episode(budget=6, max_turns=6, task_id=task,
                                            tags={"policy": policy})
                    llm = ep.openai(max_retries=0)
                    messages: list[dict[str, Any]] = [{"role": "user", "content": f"do {task}"}]
                    for turn in range(1, 4):
                        llm.chat.completions.create(model=model, messages=messages)  # type: ignore[arg-type]
                        call = {"id": f"c{turn}", "type": "function",
                                "function": {"name": "run", "arguments": f'{{"n": {turn}}}'}}
                        messages += [{"role": "assistant", "content": None, "tool_calls": [call]},
                                     {"role": "tool", "tool_call_id": f"c{turn}",
                                      "content": f"ok {turn}"},
                                     {"role": "user", "content": "continue"}]
                    ep.report(success=True)
    _wait_records(logs, lambda r: r["type"] in ("turn", "episode"), 2 * 3 * 2 * (3 + 1))
    yield server, logs
    server.stop()
    up.stop()


def _probe(capsys: pytest.CaptureFixture[str], server: ProxyServer, logs: Path,
           *extra: str) -> tuple[int, dict[str, Any], str]:
    code = main(["probe", str(logs), "--proxy", server.url, "--a", "policy=A", "--b",
                 "policy=B", *extra])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if "--json" in extra and code == 0 else {}), out + err


def _wait_records(logs: Path, match: Callable[[dict[str, Any]], bool], n: int
                  ) -> list[dict[str, Any]]:
    """The matching records once at least `n` are on disk (the writer runs off the path)."""
    deadline = time.monotonic() + 10
    while True:
        found = [r for r in read_jsonl(logs) if match(r)]
        if len(found) >= n or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def test_a_scorer_preferring_a_gives_win_rate_one_and_probe_calls_spend_nothing(
    setup: tuple[ProxyServer, Path], capsys: pytest.CaptureFixture[str], tmp_path: Path,
) -> None:
    server, logs = setup
    before = [r for r in read_jsonl(logs) if r["type"] in ("turn", "episode")]
    report = tmp_path / "probe.html"
    code, result, _ = _probe(capsys, server, logs, "--scorer", "probe_scorers:prefers_a",
                             "--states", "12", "--samples", "3", "--inject", "tool-error",
                             "--json", "--report", str(report))
    assert code == 0
    single, errors = result["single_step"], result["error_states"]
    assert single["n_states"] == 12
    assert (single["win_rate"], single["tie_rate"], single["ci_low"], single["ci_high"]) == (
        1.0, 0.0, 1.0, 1.0)
    assert single["mean_diff"] == 1.0 and single["n_tasks"] == 3
    assert (single["net_win"], single["net_ci_low"], single["net_ci_high"]) == (1.0, 1.0, 1.0)
    assert (single["diff_ci_low"], single["diff_ci_high"]) == (1.0, 1.0)
    sources = [s for s in result["states"] if s["injected"] is None]
    for task in TASKS:
        mine = [s["policy"] for s in sources if s["task_id"] == task]
        assert mine.count("a") == mine.count("b") == 2
    # turn-1 states hold no tool result to replace: others of the same policy and task take
    # their place, and each task keeps as many error states from A's trajectories as from B's
    hurt = [s for s in result["states"] if s["injected"] is not None]
    injectable = len(hurt)
    for task in TASKS:
        mine = [s["policy"] for s in hurt if s["task_id"] == task]
        assert mine.count("a") == mine.count("b")
    assert all(s["turn"] > 1 for s in hurt)
    assert errors["n_states"] == injectable == result["settings"]["injected_states"] > 0
    assert (errors["win_rate"], errors["ci_low"], errors["ci_high"]) == (1.0, 1.0, 1.0)
    # both policies answered the failed call with text, which abandons it
    assert errors["correction"] == {"a_rate": 1.0, "b_rate": 1.0, "n_states": injectable}
    assert result["continuation"] is None
    calls = result["settings"]["probe_calls"]
    assert calls == (12 + injectable) * 2 * 3 and result["settings"]["sampling_failures"] == 0
    # Every probe call is a probe record; no turn or episode record was added.
    probe_id = result["settings"]["probe_id"]
    probes = _wait_records(logs, lambda r: r.get("probe_id") == probe_id, calls)
    assert len(probes) == calls and all(r["type"] == "probe" for r in probes)
    assert {r["model"] for r in probes} == {"m-a", "m-b"}
    after = [r for r in read_jsonl(logs) if r["type"] in ("turn", "episode")]
    assert after == before
    injected = [r for r in probes if len(r["request_messages"]) > 1
                and str(r["request_messages"][-2]["content"]).startswith("Error:")]
    assert len(injected) == injectable * 2 * 3
    page = report.read_text(encoding="utf-8")
    assert "State diagnostics" in page and "100.0%" in page


def test_the_command_scorer_scores_by_exit_code_and_its_failures_are_reported(
    setup: tuple[ProxyServer, Path], capsys: pytest.CaptureFixture[str],
) -> None:
    server, logs = setup
    code, result, _ = _probe(capsys, server, logs, "--scorer", "command", "--command",
                             "grep -q model=m-a", "--states", "6", "--samples", "2", "--json")
    assert code == 0
    assert (result["single_step"]["win_rate"], result["single_step"]["n_states"]) == (1.0, 6)
    code, result, _ = _probe(capsys, server, logs, "--scorer", "command", "--command",
                             "echo broken >&2; exit 3", "--states", "6", "--samples", "2",
                             "--json")
    assert code == 0  # reported, not fatal
    s = result["settings"]
    assert s["scorer_failures"] == 6 * 2 * 2 and s["states_left_out"] == 6
    assert "exit code 3: broken" in s["failure_examples"][0]
    assert result["single_step"]["n_states"] == 0 and result["single_step"]["win_rate"] is None
    code, _, text = _probe(capsys, server, logs, "--scorer", "probe_scorers:broken",
                           "--states", "4", "--samples", "1")
    assert code == 0
    assert "could not score" in text and "RuntimeError: this scorer always fails" in text


@pytest.mark.parametrize(("extra", "message"), [
    (["--scorer", "no_such_module:f"], "cannot import 'no_such_module'"),
    (["--scorer", "probe_scorers:prefers_a", "--inject", "action"], "has no inject_action"),
    (["--scorer", "probe_scorers:prefers_a", "--continue"], "has no continue_episode"),
    (["--scorer", "command"], "needs --command"),
])
def test_bad_input_exits_2_with_one_line(
    setup: tuple[ProxyServer, Path], capsys: pytest.CaptureFixture[str], extra: list[str],
    message: str,
) -> None:
    server, logs = setup
    code, _, text = _probe(capsys, server, logs, *extra)
    assert code == 2 and message in text and len(text.strip().splitlines()) == 1


def test_no_proxy_answering_exits_2(
    setup: tuple[ProxyServer, Path], capsys: pytest.CaptureFixture[str],
) -> None:
    from conftest import free_port

    _, logs = setup
    code = main(["probe", str(logs), "--proxy", f"http://127.0.0.1:{free_port()}", "--a",
                 "policy=A", "--b", "policy=B", "--scorer", "probe_scorers:prefers_a"])
    assert code == 2 and "no proxy answers" in capsys.readouterr().err

