"""`budgetproxy demo --quick` runs the probe: probe.json beside report.html, both claims printed
with their intervals, the probe's own logs kept apart from the demo's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import read_jsonl

pytestmark = [pytest.mark.slow, pytest.mark.timeout(360)]


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path]:
    out = tmp_path_factory.mktemp("demo-probe")
    done = subprocess.run(
        [sys.executable, "-m", "budgetproxy", "demo", "--quick", "--out", str(out)],
        capture_output=True, text=True, timeout=300,  # ~20 s alone; more on a busy machine
    )
    return done, out


def test_the_demo_leaves_probe_json_and_prints_both_claims(
    demo: tuple[subprocess.CompletedProcess[str], Path],
) -> None:
    done, out = demo
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((out / "probe.json").read_text(encoding="utf-8"))
    assert set(result) >= {"single_step", "error_states", "continuation", "settings"}
    single, errors, cont = result["single_step"], result["error_states"], result["continuation"]
    assert single["n_states"] == 32 and result["settings"]["scorer"] == "frozenlake"
    assert result["settings"]["inject"] == "action"
    # seed 0 is reproducible: careful wins single steps, recovering wins after errors
    assert single["net_win"] > 0 and single["net_ci_low"] > 0
    assert errors["n_states"] > 0 and errors["net_win"] < 0 and errors["diff_ci_high"] < 0
    assert cont["n_states"] > 0 and cont["b_success"] > cont["a_success"]
    # two maps: every view is few_tasks, and the demo names no winner from them
    assert single["n_tasks"] == errors["n_tasks"] == 2
    assert single["few_tasks"] and errors["few_tasks"] and cont["few_tasks"]
    stdout = done.stdout
    assert "Single steps (32 states" in stdout and "After an injected error" in stdout
    assert "wins" not in stdout.split("State diagnostics")[1].split("Training dynamics")[0]
    assert stdout.count("2 maps: fewer than 10, too few to name a winner") == 3
    assert stdout.count("95% CI") >= 3
    assert str(out / "probe.json") in stdout
    report = (out / "report.html").read_text(encoding="utf-8")
    assert "State diagnostics (budgetproxy probe)" in report


def test_the_probes_calls_and_episodes_stay_out_of_the_demo_logs(
    demo: tuple[subprocess.CompletedProcess[str], Path],
) -> None:
    done, out = demo
    assert done.returncode == 0, done.stderr[-3000:]
    demo_records = read_jsonl(out / "trajectories")
    assert not [r for r in demo_records if r["type"] == "probe" or "probe" in (r.get("tags") or {})]
    probe_records = read_jsonl(out / "probe" / "trajectories")
    settings = json.loads((out / "probe.json").read_text(encoding="utf-8"))["settings"]
    calls = [r for r in probe_records if r["type"] == "probe"]
    assert len(calls) == settings["probe_calls"]
    continued = [r for r in probe_records if r["type"] == "episode"]
    assert continued and all(r["task_id"] is None and r["tags"]["probe"] == settings["probe_id"]
                             for r in continued)
    assert not [r for r in probe_records if r["type"] == "turn"
                and r["episode_id"] not in {e["episode_id"] for e in continued}]
    # each continuation had the turns its source episode had left at that state
    budgets = {r["episode_id"]: r["budget"] for r in demo_records if r["type"] == "episode"}
    for r in continued:
        source, turn = r["tags"]["probe_state"].split("!")[0].split("#")
        assert r["budget"] == max(1, budgets[source] - int(turn) + 1), r["tags"]


def test_analyze_passes_probe_records_over_and_leaves_continuations_out(
    demo: tuple[subprocess.CompletedProcess[str], Path], capsys: pytest.CaptureFixture[str],
) -> None:
    done, out = demo
    assert done.returncode == 0, done.stderr[-3000:]
    from budgetproxy.cli import main

    main(["analyze", str(out / "probe" / "trajectories"), "--json"])
    result = json.loads(capsys.readouterr().out)
    continued = [r for r in read_jsonl(out / "probe" / "trajectories") if r["type"] == "episode"]
    assert result["inputs"]["skipped"] == 0 and result["inputs"]["skipped_reasons"] == {}
    assert result["episodes"]["left_out_no_task_id"] == len(continued) > 0
    assert result["pass_at"] == []
