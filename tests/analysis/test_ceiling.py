"""`analyze --ceiling`: the share of tasks solvable within T at all, its source and the
headroom, checked against FrozenLake's exact shortest safe paths."""

from __future__ import annotations

import argparse
import json
import math
from collections import deque
from pathlib import Path
from typing import Any

import pytest
from records_support import episode_record

from budgetproxy.analysis import command
from budgetproxy.demo.frozenlake import (
    LAKES,
    MOVES_PER_TURN,
    TASKS,
    Task,
    min_turns,
    shortest_safe_path,
)

MAPS = (*TASKS, *LAKES)
# Maps where holes force detours or cut the goal off, beside the demo's.
ODD = (("SHG",), ("SH", "HG"), ("SFFF", "HHHF", "GFFF"), ("SFH", "FHF", "FFG"))


def analyze(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="budgetproxy")
    command.register(parser.add_subparsers())
    args = parser.parse_args(["analyze", *argv])
    code: int = args.func(args)
    return code


def _gym_shortest(rows: tuple[str, ...]) -> int | None:
    """Fewest steps from S to G in gymnasium's own transition table of the plain-ice map,
    never through a hole."""
    gym = pytest.importorskip("gymnasium")
    env = gym.make("FrozenLake-v1", desc=list(rows), is_slippery=False)
    table: Any = env.unwrapped.P  # type: ignore[attr-defined]
    width = len(rows[0])
    start = next(r * width + c for r, row in enumerate(rows) for c, x in enumerate(row) if x == "S")
    dist = {start: 0}
    queue = deque([start])
    while queue:
        s = queue.popleft()
        r, c = divmod(s, width)
        if rows[r][c] == "G":
            env.close()
            return dist[s]
        for action in range(4):
            for _, nxt, _, _ in table[s][action]:
                nr, nc = divmod(nxt, width)
                if nxt not in dist and rows[nr][nc] != "H":
                    dist[nxt] = dist[s] + 1
                    queue.append(nxt)
    env.close()
    return None


@pytest.mark.parametrize("rows", [t.rows for t in MAPS] + list(ODD))
def test_shortest_safe_path_is_gymnasiums(rows: tuple[str, ...]) -> None:
    assert shortest_safe_path(rows) == _gym_shortest(rows)


def test_odd_maps() -> None:
    assert [shortest_safe_path(r) for r in ODD] == [None, None, 8, 4]


def _log(tmp_path: Path, *, stated: bool, extra: list[dict[str, Any]] | None = None) -> Path:
    """Per map, 4 hidden episodes at the full budget: two succeed (at the task's minimum
    and at twice it), two fail. With `stated`, each episode carries the map's min_turns."""
    records = []
    for task in MAPS:
        low = min_turns(task)
        assert low is not None
        for i in range(4):
            won = i < 2
            turn = low * (i + 1)
            records.append(episode_record(
                f"{task.task_id}-{i}", task_id=task.task_id, budget=task.max_turns,
                max_turns=task.max_turns, turns_used=turn if won else task.max_turns,
                outcome="success" if won else "failure",
                end_reason="success" if won else "exhausted", success_turn=turn if won else None,
                **({"min_turns": low} if stated else {})))  # fmt: skip
    records += extra or []
    path = tmp_path / "log.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _cells(capsys: pytest.CaptureFixture[str]) -> dict[tuple[Any, int], dict[str, Any]]:
    out = json.loads(capsys.readouterr().out)
    return {(c.get("tier", c.get("turns")), c["k"]): c for c in out["pass_at"]}


def test_ceiling_is_the_share_within_the_exact_minimum(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = _log(tmp_path, stated=True)
    turns = [1, 2, 3, 4, 6]
    assert analyze(str(log), "--ceiling", "--k", "1", "--turns", ",".join(map(str, turns)),
                   "--tiers", "10,100", "--json") == 0  # fmt: skip
    cells = _cells(capsys)
    exact = {t.task_id: math.ceil((shortest_safe_path(t.rows) or 0) / MOVES_PER_TURN)
             for t in MAPS}
    for t in turns:
        cell = cells[(t, 1)]
        share = sum(m <= t for m in exact.values()) / len(exact)
        assert cell["ceiling"] == pytest.approx(share), t
        assert cell["ceiling_source"] == "min_turns" and cell["ceiling_tasks_observed"] == 0
        assert cell["headroom"] == pytest.approx(share - cell["value"])
        if 0 < share < 1:
            assert cell["ceiling_ci_low"] < share < cell["ceiling_ci_high"]
    # T = 2: the 4x4 maps (path 6, 2 turns) can be solved; the 8x8 ones (path 14) cannot
    assert cells[(2, 1)]["ceiling"] == pytest.approx(12 / 14)
    # tiers resolve per task: 10% of 16 turns is 2, of 32 is 3, of 48 is 5, of 64 is 6
    assert cells[("10%", 1)]["ceiling"] == 1.0
    assert cells[("100%", 1)]["ceiling_ci_note"] == "zero width: all tasks at 1"
    # half of each task's episodes succeed within the full budget: headroom 50 points
    assert cells[("100%", 1)]["headroom"] == pytest.approx(0.5)


def test_observed_minimum_when_none_is_stated(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    never = [episode_record(f"never-{i}", task_id="never", budget=8, max_turns=8, turns_used=8,
                            end_reason="exhausted") for i in range(2)]  # fmt: skip
    log = _log(tmp_path, stated=False, extra=never)
    assert analyze(str(log), "--ceiling", "--k", "1", "--turns", "2,4", "--json") == 0
    cells = _cells(capsys)
    # observed minima are the shortest successes, which here are the exact minima; the task
    # never solved counts as not solvable
    assert cells[(2, 1)]["ceiling"] == pytest.approx(12 / 15)
    assert cells[(4, 1)]["ceiling"] == pytest.approx(14 / 15)
    assert cells[(4, 1)]["ceiling_source"] == "observed"
    assert cells[(4, 1)]["ceiling_tasks_observed"] == 15


def test_tasks_file_over_the_logs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = _log(tmp_path, stated=False)
    tasks = tmp_path / "tasks.csv"
    tasks.write_text("task_id,min_turns\n" + "".join(
        f"{t.task_id},{min_turns(t)}\n" for t in MAPS))  # fmt: skip
    assert analyze(str(log), "--ceiling", "--tasks", str(tasks), "--k", "1", "--turns", "3",
                   "--json") == 0  # fmt: skip
    cell = _cells(capsys)[(3, 1)]
    assert cell["ceiling_source"] == "min_turns" and cell["ceiling"] == pytest.approx(12 / 14)
    jsonl = tmp_path / "tasks.jsonl"
    jsonl.write_text("".join(json.dumps({"task_id": t.task_id, "min_turns": 9}) + "\n"
                             for t in MAPS))  # fmt: skip
    assert analyze(str(log), "--ceiling", "--tasks", str(jsonl), "--turns", "3", "--k", "1",
                   "--json") == 0  # fmt: skip
    captured = capsys.readouterr()
    assert json.loads(captured.out)["pass_at"][0]["ceiling"] == 0.0
    assert "min_turns 9, but an episode succeeded at turn 2" in captured.err


def test_ceiling_text_report_and_usage(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = _log(tmp_path, stated=True)
    report = tmp_path / "r.html"
    assert analyze(str(log), "--ceiling", "--k", "1", "--tiers", "100", "--turns", "2",
                   "--report", str(report)) == 0  # fmt: skip
    text = capsys.readouterr().out
    assert "The ceiling per budget" in text and "headroom" in text
    line = next(x for x in text.splitlines() if x.startswith("2 ") and "min_turns" in x)
    assert "85.7 [" in line  # 12 of 14 tasks
    assert "The ceiling per budget" in report.read_text()
    bad = tmp_path / "bad.csv"
    bad.write_text("task_id,min_turns\nx,0\n")
    assert analyze(str(log), "--ceiling", "--tasks", str(bad)) == 2
    assert "--tasks" in capsys.readouterr().err
    assert analyze(str(log), "--tasks", str(bad)) == 2
    assert "add --ceiling" in capsys.readouterr().err


def test_min_turns_the_demo_sends() -> None:
    assert [min_turns(t) for t in TASKS] == [2, 2, 4, 4]
    assert min_turns(Task("cut", ("SH", "HG"), slippery=False, max_turns=4)) is None
