"""Tables along an axis: on turns, with no other budget, tiers and paired differences are
the turn table's, number for number."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from records_support import episode_record

from budgetproxy.analysis.command import main


def _log(path: Path, seed: int) -> Path:
    rng = random.Random(seed)
    records = []
    for i in range(160):
        max_turns = rng.choice([8, 10])
        arm = rng.choice(["hidden", "disclosed"])
        budget = rng.choice([2, 3, 5, 8]) if arm == "disclosed" else rng.randint(2, max_turns)
        won = rng.random() < 0.5
        st = rng.randint(1, budget) if won else None
        records.append(episode_record(
            f"e{i}", task_id=f"t{rng.randint(1, 12)}", disclosure=arm, budget=budget,
            max_turns=max_turns, turns_used=st or budget, success_turn=st,
            outcome="success" if won else "failure", end_reason="success" if won else "failure",
            announced_budget=None))
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    assert main(list(argv)) == 0
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


KEYS = ("k", "tier", "value", "ci_low", "ci_high", "n_tasks", "n_tasks_left_out", "n_episodes",
        "by", "ci_note", "few_tasks", "piled")


@pytest.mark.parametrize("seed", [0, 1])
def test_tiers_along_turns_are_the_turn_tables(tmp_path: Path, seed: int,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    log = str(_log(tmp_path / "log.jsonl", seed))
    common = ["--tiers", "25,50,75,100", "--k", "1,2,4", "--by", "disclosure",
              "--compare", "disclosure=disclosed,hidden"]
    table = _json(capsys, log, *common, "--json")
    along = _json(capsys, log, "--axis", "turns", *common, "--json")
    assert [{k: c[k] for k in KEYS} for c in along["pass_at"]] == [
        {k: c[k] for k in KEYS} for c in table["pass_at"]]
    assert all(c["axis"] == "turns" and c["budget"] is None for c in along["pass_at"])
    assert any(c["value"] is not None for c in along["pass_at"])
    drop = {"axis", "budget", "hold"}
    assert [{k: v for k, v in d.items() if k not in drop} for d in along["compare"]] == [
        {k: v for k, v in d.items() if k not in drop} for d in table["compare"]]
    assert any(d["diff"] is not None for d in along["compare"])
