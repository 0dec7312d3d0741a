"""`analyze --over FIELD`: Pass@(K,T) per checkpoint, in checkpoint order, with intervals."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from records_support import episode_record

from budgetproxy.analysis import command
from budgetproxy.analysis.dynamics import checkpoint_order


def analyze(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="budgetproxy")
    command.register(parser.add_subparsers())
    args = parser.parse_args(["analyze", *argv])
    code: int = args.func(args)
    return code


def write(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


# Successes of 4 episodes per task (12 tasks, t00..t11) at each training step: the series a
# reader would tabulate by hand. Steps are written out of order, and "10" < "2" as text.
WINS = {
    "10": [1, 2, 2, 3, 1, 0, 2, 4, 3, 2, 1, 2],
    "2": [0, 1, 0, 1, 0, 0, 2, 1, 1, 0, 0, 1],
    "100": [4, 3, 4, 4, 2, 3, 4, 4, 3, 4, 3, 4],
}


def _series_log(tmp_path: Path) -> Path:
    records = []
    for step, wins in WINS.items():
        for t, won in enumerate(wins):
            for i in range(4):
                ok = i < won
                records.append(episode_record(
                    f"s{step}-t{t}-{i}", task_id=f"t{t:02d}", budget=10, max_turns=10,
                    turns_used=6 if ok else 10, outcome="success" if ok else "failure",
                    end_reason="success" if ok else "exhausted", success_turn=6 if ok else None,
                    tags={"step": step}))  # fmt: skip
    records.append(episode_record("no-step", task_id="t00", budget=10, max_turns=10))
    return write(tmp_path / "log.jsonl", records)


def _hand_ci(values: list[float], resamples: int = 1000, seed: int = 0) -> tuple[float, float]:
    """The documented interval, computed here from its definition: resample the tasks'
    estimates (in task_id order) with numpy's generator at `seed`, take the 95% quantile of
    |mean* − mean| / se*, se*² = (s*² + s²/m)/m, as the half-width in units of
    se = √((s² + s²/m)/m), and keep it within the values' range."""
    data = np.asarray(values)
    m = len(data)
    drawn = data[np.random.default_rng(seed).integers(0, m, size=(resamples, m))]
    smoothing = data.var(ddof=1) / m
    ratios = np.abs(drawn.mean(axis=1) - data.mean()) / np.sqrt(
        (drawn.var(axis=1, ddof=1) + smoothing) / m)
    half = np.quantile(ratios, 0.95) * np.sqrt((smoothing * m + smoothing) / m)
    return max(data.mean() - half, data.min()), min(data.mean() + half, data.max())


def test_over_orders_checkpoints_numerically_with_intervals(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = _series_log(tmp_path)
    assert analyze(str(log), "--over", "step", "--k", "1", "--tiers", "50,100", "--json") == 0
    out = json.loads(capsys.readouterr().out)
    assert [p["value"] for p in out["over"]] == ["2", "10", "100"]
    assert out["settings"]["over"] == "step" and out["settings"]["over_missing_episodes"] == 1
    for point in out["over"]:
        wins = WINS[point["value"]]
        per_task = [w / 4 for w in wins]
        at_50, at_100 = point["pass_at"]
        # 50% of 10 turns is 5: every success came at turn 6, so none is within T = 5
        assert (at_50["tier"], at_50["value"], at_50["ci_note"]) == ("50%", 0.0,
                                                                       "zero width: all tasks at 0")
        assert at_100["tier"] == "100%" and at_100["by"] == {}
        assert at_100["value"] == pytest.approx(sum(per_task) / 12)
        low, high = _hand_ci(per_task)
        assert (at_100["ci_low"], at_100["ci_high"]) == (pytest.approx(low), pytest.approx(high))
        assert at_100["n_tasks"] == 12 and at_100["n_episodes"] == 48
        assert at_100["few_tasks"] is False
    # the intervals separate the first and last checkpoints: a trend the intervals carry
    first, last = out["over"][0]["pass_at"][1], out["over"][-1]["pass_at"][1]
    assert first["ci_high"] < last["ci_low"]


def test_over_text_and_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = _series_log(tmp_path)
    report = tmp_path / "r.html"
    assert analyze(str(log), "--over", "step", "--k", "1,2", "--tiers", "100",
                   "--report", str(report)) == 0  # fmt: skip
    text = capsys.readouterr().out
    assert "Pass@(1,T) per checkpoint (step)" in text
    table = text[text.index("Pass@(1,T) per checkpoint"):].splitlines()
    assert table[2].split() == ["step", "100%"]
    assert [line.split()[0] for line in table[3:6]] == ["2", "10", "100"]
    mean_10 = 100 * sum(WINS["10"]) / 48
    assert f"{mean_10:.1f} [" in text
    assert "1 episode(s) without step are in no checkpoint" in text
    html = report.read_text()
    assert "Training dynamics: Pass@(1,T) per step" in html and "checkpoint (step)" in html


def test_checkpoint_order() -> None:
    assert checkpoint_order(["10", "2", "1e3", "2.5"]) == ["2", "2.5", "10", "1e3"]
    # any value that is not a number: first appearance, as given
    assert checkpoint_order(["rl-3", "base", "rl-10"]) == ["rl-3", "base", "rl-10"]
    assert checkpoint_order(["3", "nan"]) == ["3", "nan"]
    assert checkpoint_order([]) == []


def test_over_names_first_appearance_by_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    records = []
    for model, start in (("zeta", "2026-11-30T09:00:00.000Z"),
                         ("alpha", "2026-11-30T11:00:00.000Z"),
                         ("mid", "2026-11-30T10:00:00.000Z")):
        for t in range(3):
            records.append(episode_record(f"{model}-{t}", task_id=f"t{t}", model=model,
                                          started_at=start, budget=10, max_turns=10))
    log = write(tmp_path / "log.jsonl", records)
    assert analyze(str(log), "--over", "model", "--k", "1", "--tiers", "100", "--json") == 0
    out = json.loads(capsys.readouterr().out)
    assert [p["value"] for p in out["over"]] == ["zeta", "mid", "alpha"]
    assert all(p["pass_at"][0]["few_tasks"] for p in out["over"])  # 3 tasks each


def test_over_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = _series_log(tmp_path)
    assert analyze(str(log), "--over", "step", "--axis", "tokens", "--budgets", "10") == 2
    assert "--over reads turns" in capsys.readouterr().err
    assert analyze(str(log), "--over", "step", "--by", "step") == 2
    assert "already in --by" in capsys.readouterr().err
    assert analyze(str(log), "--over", "nothing", "--json") == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["over"] == []
    assert "no episode has this field or tag" in captured.err
