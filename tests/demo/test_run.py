"""`budgetproxy demo --quick`: a real run through the proxy, leaving its table, report and logs."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from conftest import read_jsonl

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path]:
    out = tmp_path_factory.mktemp("demo")
    done = subprocess.run(
        [sys.executable, "-m", "budgetproxy", "demo", "--quick", "--out", str(out)],
        capture_output=True, text=True, timeout=110,
    )
    return done, out


def test_demo_prints_the_table_and_what_it_shows(
    demo: tuple[subprocess.CompletedProcess[str], Path],
) -> None:
    done, out = demo
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Pass@(K,T)" in done.stdout
    for policy in ("careful", "recovering", "budget-aware"):
        assert policy in done.stdout
    assert "What this shows" in done.stdout
    # Every claim carries its interval; two maps are too few to claim much, and it says so.
    assert "careful − recovering (paired over 2 tasks; fewer than 10" in done.stdout
    assert "Disclosure changes behaviour. Pass@1, budget-aware, disclosed − hidden" in done.stdout
    assert re.search(r"at 25% [+-]\d\.\d\d (\[[+-]\d\.\d\d, [+-]\d\.\d\d\]|\(zero width)",
                     done.stdout), done.stdout  # fmt: skip
    assert str(out / "report.html") in done.stdout
    assert "episodes" in done.stderr  # the progress bar


def test_demo_leaves_report_metrics_and_trajectories(
    demo: tuple[subprocess.CompletedProcess[str], Path],
) -> None:
    done, out = demo
    assert done.returncode == 0, done.stderr[-3000:]
    report = (out / "report.html").read_text(encoding="utf-8")
    assert "What this demo shows" in report and "Pass@(K,T)" in report
    assert "<div class=claim><h3>Enforcement</h3>" in report  # laid out, not a text dump
    # every task row links to its page in the episode view beside the report
    links = re.findall(r"<td><a href='(episodes/task-[^']+)'>", report)
    assert len(links) == 2 and all((out / link).exists() for link in links)
    assert (out / "episodes" / "index.html").exists()
    assert "refused for a spent budget" in done.stdout and "in the token arm" in done.stdout
    metrics = (out / "metrics.txt").read_text(encoding="utf-8")
    assert "budgetproxy_turns_total" in metrics
    assert 'budgetproxy_episodes_finished_total{disclosure="disclosed"' in metrics
    analysis = json.loads((out / "pass_at.json").read_text(encoding="utf-8"))
    cells = analysis["pass_at"]
    assert {c["by"]["policy"] for c in cells} == {"careful", "recovering", "budget-aware"}
    assert {(d["field"], d["a"], d["b"]) for d in analysis["compare"]} == {
        ("policy", "careful", "recovering"), ("disclosure", "disclosed", "hidden")}
    assert (out / "summary.txt").read_text(encoding="utf-8").startswith("What this shows")


def test_the_likelihood_view_is_left_and_claimed_with_intervals(
    demo: tuple[subprocess.CompletedProcess[str], Path],
) -> None:
    done, out = demo
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((out / "likelihood.json").read_text(encoding="utf-8"))
    step = result["per_step"]
    assert step["a"]["n"] > 0 and step["b"]["n"] > 0 and step["a"]["few_tasks"] is True
    # careful is the reference: its own trajectories' ratio is exactly 0
    assert result["trajectory_llr"]["a_success"]["llr_mean"] in (0.0, None)
    assert result["settings"]["reference"] == "sim-careful"
    assert result["settings"]["scoring_failures"] == 0
    assert "Likelihood view (budgetproxy likelihood" in done.stdout
    assert "2 maps: fewer than 10, too few to name a difference" in done.stdout
    assert "Likelihood view" in (out / "report.html").read_text(encoding="utf-8")
    assert any(r["type"] == "probe" for r in read_jsonl(out / "likelihood" / "trajectories"))


def test_the_runs_went_through_the_proxy(
    demo: tuple[subprocess.CompletedProcess[str], Path],
) -> None:
    done, out = demo
    assert done.returncode == 0, done.stderr[-3000:]
    records = read_jsonl(out / "trajectories")
    kinds = Counter(r["type"] for r in records)
    assert kinds["turn"] > 500 and kinds["episode"] > 200
    episodes = [r for r in records if r["type"] == "episode"]
    assert all(r["end_reason"] != "abandoned" for r in episodes)
    assert {r["end_reason"] for r in episodes} >= {"success", "exhausted"}
    assert {r["tags"]["policy"] for r in episodes} == {"careful", "recovering", "budget-aware"}
    mix = [r for r in episodes if r["tags"]["run"] == "budgetmix"]
    by_group: dict[tuple[str, str], set[int]] = {}
    for r in mix:
        by_group.setdefault((r["task_id"], r["group"]), set()).add(r["budget"])
    assert by_group and all(len(b) == 1 for b in by_group.values())  # one budget per group
    turns = [r for r in records if r["type"] == "turn"]
    disclosed = [t for t in turns if t["disclosure"]["arm"] == "disclosed" and t["status"] == "ok"]
    assert disclosed and all(" remain" in (t["disclosure"]["text"] or "") for t in disclosed)
    assert {t["model"] for t in turns} == {"sim-careful", "sim-recovering", "sim-budget-aware"}
    assert any(t["status"] == "rejected" for t in turns)  # spent budgets were refused


def test_the_token_arm_is_enforced_disclosed_and_claimed(
    demo: tuple[subprocess.CompletedProcess[str], Path],
) -> None:
    done, out = demo
    assert done.returncode == 0, done.stderr[-3000:]
    assert re.search(r"- A token budget, disclosed\. Pass@1, budget-aware at its full turn budget "
                     r"and a token budget, disclosed − hidden \(paired over 2 tasks; fewer than "
                     r"10.*\): [+-]\d\.\d\d", done.stdout), done.stdout  # fmt: skip
    assert "Fewer than 10 tasks: too few to name an effect." in done.stdout
    records = read_jsonl(out / "trajectories-tokens")
    episodes = [r for r in records if r["type"] == "episode"]
    assert len(episodes) == 2 * 2 * 8  # two maps, two arms, k = 8
    assert all(r["token_budget"] and r["budget"] == r["max_turns"] for r in episodes)
    assert {r["disclosure"] for r in episodes} == {"hidden", "disclosed"}
    assert any(r["exhausted_by"] == "tokens" for r in episodes)
    turns = [r for r in records if r["type"] == "turn" and r["status"] == "ok"]
    prompts: dict[str, int] = {}
    for t in turns:
        prompts[t["episode_id"]] = max(prompts.get(t["episode_id"], 0), t["usage"]["prompt_tokens"])
    # Output never passes the budget; the total passes it by at most the last call's prompt.
    assert all(r["tokens_used"] <= r["token_budget"] + prompts[r["episode_id"]] for r in episodes)
    told = [t for t in turns if t["disclosure"]["arm"] == "disclosed"]
    assert told and all(" tokens remain of " in t["disclosure"]["text"] for t in told)
    assert all(t["usage"]["prompt_tokens"] > 100 and t["cumulative"]["tokens"] for t in turns)
    analysis = json.loads((out / "pass_at.json").read_text(encoding="utf-8"))
    assert {(d["field"], d["a"], d["b"]) for d in analysis["token_arm"]["compare"]} == {
        ("disclosure", "disclosed", "hidden")}
    # The main analysis reads the tier runs only: the token arm logs apart.
    assert all(r["tags"]["run"] != "tokens" for r in read_jsonl(out / "trajectories")
               if r["type"] == "episode")


def test_the_live_experiment_assigns_arms_and_says_when_it_could_stop(
    demo: tuple[subprocess.CompletedProcess[str], Path],
) -> None:
    done, out = demo
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Live experiment 'budget-told'" in done.stdout
    # the disclosed budget beats the hidden one by far at a quarter of it: a decision
    assert re.search(r"hidden - disclosed: could stop after \d+ episodes with stop_b_better "
                     r"\(difference [+-]\d\.\d\d, always-valid interval", done.stdout), done.stdout
    view = json.loads((out / "experiment.json").read_text(encoding="utf-8"))
    assert [a["name"] for a in view["arms"]] == ["hidden", "disclosed", "told-full"]
    episodes = [r for r in read_jsonl(out / "trajectories-experiment") if r["type"] == "episode"]
    assert {r["arm"] for r in episodes} == {"hidden", "disclosed", "told-full"}
    told = [r for r in episodes if r["arm"] == "told-full"]
    assert all(r["announced_budget"] == 48 and r["budget"] == 12 for r in told)
    assert sum(a["episodes"] for a in view["arms"]) == len(episodes)


def test_the_demo_leaves_the_dynamics_and_the_ceiling(
    demo: tuple[subprocess.CompletedProcess[str], Path],
) -> None:
    done, out = demo
    assert done.returncode == 0, done.stderr[-3000:]
    dynamics = json.loads((out / "dynamics.json").read_text(encoding="utf-8"))
    points = dynamics["analyze"]["over"]
    assert [p["value"] for p in points] == ["0", "100", "200", "300"]
    for p in points:
        cell = next(c for c in p["pass_at"] if c["tier"] == "25%")
        # the maps' shortest safe paths were sent as min_turns: both fit in 25% of the budget
        assert (cell["ceiling"], cell["ceiling_source"]) == (1.0, "min_turns")
        assert cell["headroom"] == pytest.approx(1.0 - cell["value"])
    probe = dynamics["probe"]
    assert [p["value"] for p in probe["over"]] == ["100", "200", "300"]
    assert probe["settings"]["reference"] == "step=0"
    assert all(p["single_step"]["few_tasks"] for p in probe["over"])  # two maps
    assert "Training dynamics (simulated checkpoints step 0, 100, 200, 300" in done.stdout
    assert "too few maps to read a trend" in done.stdout
    assert "The ceiling at 25% of the budget: 100% of the maps" in done.stdout
    records = read_jsonl(out / "trajectories")
    assert {r["min_turns"] for r in records if r["type"] == "episode"} == {2}
    assert "State diagnostics per checkpoint (step)" in (out / "report.html").read_text(
        encoding="utf-8")
