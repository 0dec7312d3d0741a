"""`analyze --experiment`: a live experiment's view from the logs, and the Pass@ pass over them."""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from records_support import episode_record

from budgetproxy.analysis import command
from budgetproxy.config import ExperimentConfig
from budgetproxy.core.experiment import Finished, experiment_view, settings_record

EXP = ExperimentConfig.model_validate({
    "name": "told", "unit": "episode", "min_effect": 0.2,
    "arms": [{"name": "hidden", "disclosure": "hidden"},
             {"name": "disclosed", "disclosure": "disclosed"}]})


def analyze(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser(prog="budgetproxy")
    command.register(parser.add_subparsers())
    args = parser.parse_args(["analyze", *argv])
    code: int = args.func(args)
    done = capsys.readouterr()
    return code, done.out, done.err


def write_log(tmp_path: Path) -> list[Finished]:
    records: list[dict[str, Any]] = [
        {"schema": 1, "type": "experiment", "ts": "2026-11-30T09:59:00.000Z",
         **settings_record(EXP)}]
    finished = []
    for i in range(40):
        arm = ("hidden", "disclosed")[i % 2]
        won = arm == "disclosed" or i % 4 == 0
        ended = f"2026-11-30T10:{i // 60:02d}:{i % 60:02d}.000Z"
        records.append(episode_record(
            f"ep{i}", task_id=f"t{i % 4 // 2}", disclosure=arm, experiment="told", arm=arm,
            outcome="success" if won else "failure", end_reason="success" if won else "failure",
            success_turn=3 if won else None, ended_at=ended))
        finished.append(Finished(f"ep{i}", f"t{i % 4 // 2}", arm, won, ended))
    records.append({"schema": 1, "type": "experiment_decision", "ts": "2026-11-30T11:00:00.000Z",
                    "experiment": "told", "decision": "stop_b_better", "next_arm": "disclosed",
                    "arms": [], "difference": {}})
    lines = "".join(json.dumps(r) + "\n" for r in records)
    half = len(lines) // 2
    cut = lines.index("\n", half) + 1  # two files, one gzipped: both are read
    (tmp_path / "a.jsonl").write_text(lines[:cut])
    with gzip.open(tmp_path / "b.jsonl.gz", "wt") as f:
        f.write(lines[cut:])
    return finished


def test_the_view_from_the_logs_is_the_live_one(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    finished = write_log(tmp_path)
    code, out, _ = analyze(capsys, str(tmp_path), "--experiment", "told", "--json")
    assert code == 0
    view = json.loads(out)
    live = experiment_view(EXP, finished, "stop_b_better")
    assert view == json.loads(json.dumps(live))
    assert view["arms"][1] == {"name": "disclosed", "episodes": 20, "successes": 20,
                               "estimate": 1.0, "left_out": 0, "clipped": 0}
    code, out, _ = analyze(capsys, str(tmp_path), "--experiment", "told")
    assert code == 0 and "hidden - disclosed" in out


def test_an_experiment_without_its_settings_record(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    write_log(tmp_path)
    code, _, err = analyze(capsys, str(tmp_path), "--experiment", "other", "--json")
    assert code == 1
    assert "no record of experiment 'other'" in err


def test_pass_at_passes_over_experiment_records(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    write_log(tmp_path)
    code, out, _ = analyze(capsys, str(tmp_path), "--json", "--k", "1")
    assert code == 0
    inputs = json.loads(out)["inputs"]
    assert inputs["skipped"] == 0, inputs
    assert inputs["episode_records"] == 40


def test_an_invalid_settings_record_is_one_line(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "log.jsonl"
    log.write_text(json.dumps({"schema": 1, "type": "experiment", "name": "x"}) + "\n")
    code, out, err = analyze(capsys, str(tmp_path), "--experiment", "x")
    assert code == 1 and out == ""
    assert err == (f"budgetproxy analyze: invalid settings record of experiment 'x' in {log}: "
                   "arms: Field required\n")
