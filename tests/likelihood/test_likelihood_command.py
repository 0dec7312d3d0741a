"""`budgetproxy likelihood` end to end: logs written by a real proxy (tokens captured) in front of
the fake LM, every action scored through the proxy, figures against the fake's exact values."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from conftest import read_jsonl

from budgetproxy.cli import main
from budgetproxy.client import BudgetClient
from budgetproxy.config import load_config
from budgetproxy.likelihood.scoring import chatml
from budgetproxy.likelihood.stats import within
from budgetproxy.serve.server import ProxyServer
from budgetproxy.testing.fake_lm import FakeLM, chat_ids, sequence_logprobs, text_tokens
from budgetproxy.testing.fake_tokens import BOS

TASKS = ("t1", "t2", "t3")
REF = "lm-ref"
POLICIES = {"A": "lm-a", "B": "lm-b"}


def exact(model: str, messages: list[dict[str, Any]], reply: dict[str, Any]) -> float:
    """log p(reply | messages) under the fake LM, by its chat template."""
    full = chat_ids([*messages, reply], generation_prompt=False)
    start = len(chat_ids(messages))
    return sum(lp for lp in sequence_logprobs(model, full)[start:] if lp is not None)


def exact_echo(model: str, messages: list[dict[str, Any]], reply: dict[str, Any]) -> float:
    """The same through the echo path: ChatML text, tokens overlapping the reply's text."""
    head = chatml(messages)
    text = head + str(reply["content"]) + "<|im_end|>"
    toks = text_tokens(text)
    lps = sequence_logprobs(model, [BOS, *(t for t, _, _ in toks)])[1:]
    return sum(lp for (_, piece, off), lp in zip(toks, lps, strict=True)
               if off < len(text) and off + len(piece) > len(head) and lp is not None)


@dataclass
class Logged:
    """What the generating loop sent and got: per policy, task and episode, (messages, reply)."""

    steps: list[tuple[str, str, str, list[dict[str, Any]], dict[str, Any]]] = field(
        default_factory=list)  # (policy, task, episode id, messages, reply)
    success: dict[str, bool] = field(default_factory=dict)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ProxyServer, Path, Logged]]:
    """A proxy capturing tokens in front of the fake LM; logs of A (lm-a) and B (lm-b): two
    finished episodes per task each, three turns; the first of each success, the second not."""
    logs = tmp_path_factory.mktemp("likelihood-logs")
    lm = FakeLM().start()
    config = load_config(None, {"upstreams": [{"name": "lm", "base_url": lm.base_url,
                                               "capture_tokens": True, "token_server": "vllm"}],
                                "trajectories": {"dir": str(logs)},
                                "metrics": {"enabled": False}})
    server = ProxyServer(config).start()
    logged = Logged()
    with BudgetClient(server.url) as api:
        for policy, model in POLICIES.items():
            for task in TASKS:
                for i in range(2):
                    ep = api.create_episode(budget=6, max_turns=6, task_id=task,
                                            tags={"policy": policy})
                    llm = ep.openai(max_retries=0)
                    messages: list[dict[str, Any]] = [{"role": "user",
                                                       "content": f"do {task} #{i}"}]
                    for turn in range(1, 4):
                        got = llm.chat.completions.create(model=model, messages=messages,  # type: ignore[arg-type]
                                                          seed=turn)
                        reply = {"role": "assistant", "content": got.choices[0].message.content}
                        logged.steps.append((policy, task, ep.episode_id, list(messages), reply))
                        messages += [reply, {"role": "user", "content": f"next {turn}"}]
                    ep.report(success=i == 0)
                    logged.success[ep.episode_id] = i == 0
    _wait(logs, 2 * 3 * 2 * (3 + 1))
    yield server, logs, logged
    server.stop()
    lm.stop()


def _wait(logs: Path, n: int) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if sum(r["type"] in ("turn", "episode") for r in read_jsonl(logs)) >= n:
            return
        time.sleep(0.05)


def _run(capsys: pytest.CaptureFixture[str], url: str, logs: Path, *extra: str,
         ) -> tuple[int, dict[str, Any], str]:
    code = main(["likelihood", str(logs), "--proxy", url, "--a", "policy=A", "--b", "policy=B",
                 "--reference", REF, *extra])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if "--json" in extra and code == 0 else {}), out + err


def _llr(logged: Logged, policy: str, success: bool) -> list[float]:
    per: dict[str, float] = {}
    for p, _, eid, messages, reply in logged.steps:
        if p == policy and logged.success[eid] is success:
            per[eid] = per.get(eid, 0.0) + exact(POLICIES[p], messages, reply) - exact(
                REF, messages, reply)
    return list(per.values())


def test_per_step_nll_is_the_fake_models_exact_value(
        setup: tuple[ProxyServer, Path, Logged], capsys: pytest.CaptureFixture[str]) -> None:
    server, logs, logged = setup
    code, result, text = _run(capsys, server.url, logs, "--json")
    assert code == 0, text
    for side, policy in (("a", "A"), ("b", "B")):
        want = [-exact(REF, m, r) for p, _, _, m, r in logged.steps if p == policy]
        got = result["per_step"][side]
        assert got["n"] == len(want) == 18 and got["n_tasks"] == 3 and got["few_tasks"] is True
        assert got["nll_mean"] == pytest.approx(sum(want) / len(want), abs=1e-9)
        assert got["ci_low"] <= got["nll_mean"] <= got["ci_high"]
    assert result["settings"]["methods"] == {REF: "prompt_logprobs"}


def test_trajectory_llr_from_captured_logprobs_and_scored_agree(
        setup: tuple[ProxyServer, Path, Logged], capsys: pytest.CaptureFixture[str]) -> None:
    """π_policy from the logprobs the proxy captured, and from scoring under the policy's own
    model, give the exact log π_policy(τ)/π_ref(τ), split by success."""
    server, logs, logged = setup
    code, captured, text = _run(capsys, server.url, logs, "--json")
    assert code == 0, text
    assert captured["settings"]["own_logprobs"] == {"captured": 12, "scored": 0}
    code, scored, text = _run(capsys, server.url, logs, "--json", "--own", "scored")
    assert code == 0, text
    assert scored["settings"]["own_logprobs"] == {"captured": 0, "scored": 12}
    for side, policy in (("a", "A"), ("b", "B")):
        for kind in ("success", "failure"):
            want = _llr(logged, policy, kind == "success")
            for result in (captured, scored):
                got = result["trajectory_llr"][f"{side}_{kind}"]
                assert got["n"] == len(want) == 3
                assert got["llr_mean"] == pytest.approx(sum(want) / len(want), abs=1e-9)


def test_length_matched_pairs_within_ten_percent(
        setup: tuple[ProxyServer, Path, Logged], capsys: pytest.CaptureFixture[str]) -> None:
    server, logs, _ = setup
    code, result, text = _run(capsys, server.url, logs, "--json", "--length-match", "0.1")
    assert code == 0, text
    lm = result["length_matched"]
    assert set(lm) >= {"diff_nats", "ci_low", "ci_high", "n_pairs", "n_tasks"}
    assert lm["n_pairs"] <= 6 and lm["tolerance"] == 0.1
    if lm["n_pairs"]:
        assert lm["ci_low"] <= lm["diff_nats"] <= lm["ci_high"]
    code, wide, _ = _run(capsys, server.url, logs, "--json", "--length-match", "0.99")
    assert wide["length_matched"]["n_pairs"] == 6  # every trajectory paired once, per task
    assert within(100, 90, 0.1) and not within(100, 89, 0.1)


def test_echo_path_scores_the_chatml_rendering_exactly(
        setup: tuple[ProxyServer, Path, Logged], capsys: pytest.CaptureFixture[str]) -> None:
    server, logs, logged = setup
    code, result, text = _run(capsys, server.url, logs, "--json", "--method", "echo")
    assert code == 0, text
    assert result["settings"]["methods"] == {}  # forced, not detected
    want = [-exact_echo(REF, m, r) for p, _, _, m, r in logged.steps if p == "A"]
    assert result["per_step"]["a"]["nll_mean"] == pytest.approx(sum(want) / len(want),
                                                                abs=1e-9)


def test_json_shape_text_and_report(setup: tuple[ProxyServer, Path, Logged],
                                    capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    server, logs, _ = setup
    code, result, text = _run(capsys, server.url, logs, "--json", "--trajectories", "1")
    assert code == 0, text
    assert set(result) == {"per_step", "trajectory_llr", "length_matched", "settings"}
    assert set(result["per_step"]) == {"a", "b", "diff"}
    for key in ("nll_mean", "ci_low", "ci_high", "n"):
        assert key in result["per_step"]["a"]
    assert set(result["trajectory_llr"]) == {"a_success", "a_failure", "b_success",
                                             "b_failure"}
    assert result["settings"]["trajectories"] == {"a": 3, "b": 3}
    report = tmp_path / "l.html"
    code, _, text = _run(capsys, server.url, logs, "--report", str(report))
    assert code == 0
    assert "Per-step NLL under the reference" in text and "Fewer than 10 tasks" in text
    assert "Likelihood view" in report.read_text(encoding="utf-8")


def test_scoring_calls_spend_no_budget_and_are_probe_records(
        setup: tuple[ProxyServer, Path, Logged], capsys: pytest.CaptureFixture[str]) -> None:
    server, logs, _ = setup
    before = sum(r["type"] == "turn" for r in read_jsonl(logs))
    code, _, text = _run(capsys, server.url, logs, "--trajectories", "1")
    assert code == 0, text
    time.sleep(0.3)
    records = read_jsonl(logs)
    assert sum(r["type"] == "turn" for r in records) == before
    assert any(r["type"] == "probe" and r["probe_id"].startswith("likelihood-")
               for r in records)


@pytest.mark.parametrize("offers, named", [((), "prompt_logprobs"), (("echo",), None)])
def test_upstream_without_scoring_is_a_clear_error(
        setup: tuple[ProxyServer, Path, Logged], capsys: pytest.CaptureFixture[str],
        offers: tuple[str, ...], named: str | None) -> None:
    """An upstream offering neither way exits 2 naming both; one offering echo is used."""
    _, logs, _ = setup
    with FakeLM(offers=offers) as lm:
        code, result, text = _run(capsys, lm.base_url, logs, "--json", "--own", "scored",
                                  "--trajectories", "1")
    if named is None:
        assert code == 0, text
        assert set(result["settings"]["methods"].values()) == {"echo"}
    else:
        assert code == 2 and "Traceback" not in text
        assert "prompt_logprobs" in text and "echo" in text and text.count("\n") == 1


@pytest.mark.parametrize("args, says", [
    (["--a", "policy=Z"], "policy=Z"),
    (["--b", "policy=A"], "same episodes"),
    (["--length-match", "1.5"], "--length-match"),
])
def test_bad_input_exits_2_with_one_line(setup: tuple[ProxyServer, Path, Logged],
                                         capsys: pytest.CaptureFixture[str],
                                         args: list[str], says: str) -> None:
    server, logs, _ = setup
    base = ["likelihood", str(logs), "--proxy", server.url, "--a", "policy=A", "--b",
            "policy=B", "--reference", REF]
    code = main([*base, *args])
    out, err = capsys.readouterr()
    assert code == 2 and says in err and err.count("\n") == 1


def test_no_server_answering_exits_2(setup: tuple[ProxyServer, Path, Logged],
                                     capsys: pytest.CaptureFixture[str]) -> None:
    _, logs, _ = setup
    code, _, text = _run(capsys, "http://127.0.0.1:9", logs)
    assert code == 2 and "scoring under" in text and "Traceback" not in text
