"""`analyze --compare FIELD=A,B`: paired per-task differences with bootstrap CIs."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest
from records_support import episode_record

from budgetproxy.analysis import command
from budgetproxy.analysis.compare import parse_comparison
from budgetproxy.analysis.stats import ADJUSTMENTS, adjust_p


def analyze(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="budgetproxy")
    command.register(parser.add_subparsers())
    args = parser.parse_args(["analyze", *argv])
    code: int = args.func(args)
    return code


def ep(eid: str, task: str, arm: str, won: bool, **fields: Any) -> dict[str, Any]:
    return episode_record(
        eid, task_id=task, disclosure=arm, budget=10, max_turns=10, turns_used=4,
        outcome="success" if won else "failure", end_reason="success" if won else "failure",
        success_turn=4 if won else None, **fields,
    )  # fmt: skip


def write(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_paired_differences_per_task(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # 20 tasks of very different difficulty; on each, disclosed has exactly one more success
    # of 4 than hidden. The spread between tasks cancels in the pairs: every difference is
    # +0.25, so the interval has zero width and says so.
    records = []
    for t in range(20):
        base = t % 4  # hidden wins 0..3 of 4
        for i in range(4):
            records.append(ep(f"h{t}-{i}", f"t{t}", "hidden", i < base, tags={"m": "x"}))
            records.append(ep(f"d{t}-{i}", f"t{t}", "disclosed", i < base + 1, tags={"m": "x"}))
    records.append(ep("lonely", "t99", "hidden", True, tags={"m": "x"}))  # unpaired task
    log = write(tmp_path / "log.jsonl", records)
    assert analyze(str(log), "--json", "--k", "1", "--tiers", "100", "--by", "m",
                   "--compare", "disclosure=disclosed,hidden") == 0  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    (row,) = out["compare"]
    assert row["field"] == "disclosure" and (row["a"], row["b"]) == ("disclosed", "hidden")
    assert row["by"] == {"m": "x"} and row["tier"] == "100%" and row["k"] == 1
    assert row["diff"] == pytest.approx(0.25)
    assert (row["n_tasks"], row["n_tasks_unpaired"]) == (20, 1)
    assert row["ci_note"] == "zero width: all tasks equal" and not row["excludes_zero"]
    assert out["settings"]["compare"] == ["disclosure=disclosed,hidden"]


def test_a_noisy_but_real_difference_excludes_zero(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    records = []
    for t in range(30):
        gain = 1 + t % 3  # disclosed wins 1..3 more of 4, hidden 0 or 1
        base = t % 2
        for i in range(4):
            records.append(ep(f"h{t}-{i}", f"t{t}", "hidden", i < base))
            records.append(ep(f"d{t}-{i}", f"t{t}", "disclosed", i < min(4, base + gain)))
    log = write(tmp_path / "log.jsonl", records)
    assert analyze(str(log), "--k", "1,2", "--tiers", "100",
                   "--compare", "disclosure=disclosed,hidden") == 0  # fmt: skip
    text = capsys.readouterr().out
    assert "Paired differences, disclosure: disclosed − hidden" in text
    line = next(x for x in text.splitlines() if x.startswith("100%") and " 1 " in x[:12])
    assert line.rstrip().endswith("*"), line  # the interval excludes 0


def test_few_paired_tasks_are_flagged(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    records = [ep(f"{arm}{t}-{i}", f"t{t}", arm, (t + i) % 2 == 0)
               for t in range(3) for arm in ("hidden", "disclosed") for i in range(2)]
    log = write(tmp_path / "log.jsonl", records)
    analyze(str(log), "--json", "--k", "1", "--tiers", "100", "--compare",
            "disclosure=hidden,disclosed")  # fmt: skip
    (row,) = json.loads(capsys.readouterr().out)["compare"]
    assert row["n_tasks"] == 3 and row["few_tasks"] is True
    analyze(str(log), "--k", "1", "--tiers", "100", "--compare", "disclosure=hidden,disclosed")
    assert "†: fewer than 10 tasks, or under 2K eligible episodes a task on average " \
        "(paired)" in capsys.readouterr().out


def test_a_value_no_episode_has_is_said(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = write(tmp_path / "log.jsonl", [ep("a", "t1", "hidden", True)])
    analyze(str(log), "--k", "1", "--compare", "model=m,other")
    assert "no episode has model = 'other'" in capsys.readouterr().err


@pytest.mark.parametrize("text", ["disclosure", "disclosure=a", "=a,b", "x=a,a", "x=a,b,c"])
def test_bad_compare_argument(text: str) -> None:
    with pytest.raises(ValueError):
        parse_comparison(text)


def _moderate(tmp_path: Path) -> Path:
    """24 tasks in two slices (tag m), 4 episodes per arm; disclosed ahead by a little in one
    slice (ahead on 7 of its 14 tasks, behind on one), a lot in the other; slice "z" has
    hidden episodes only (no pairs at all)."""
    records = []
    for t in range(24):
        m = "weak" if t < 14 else "strong"
        gain = (1 if t % 2 == 0 else -1 if t == 13 else 0) if m == "weak" else 2
        base = t % 2
        for i in range(4):
            records.append(ep(f"h{t}-{i}", f"t{t}", "hidden", i < base, tags={"m": m}))
            records.append(ep(f"d{t}-{i}", f"t{t}", "disclosed", i < base + gain,
                              tags={"m": m}))
    records += [ep(f"z{i}", f"t{i}", "hidden", True, tags={"m": "z"}) for i in range(4)]
    return write(tmp_path / "log.jsonl", records)


def test_empty_strata_are_not_printed_but_counted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = _moderate(tmp_path)
    assert analyze(str(log), "--k", "1,2", "--tiers", "50,100", "--by", "m",
                   "--compare", "disclosure=disclosed,hidden") == 0
    text = capsys.readouterr().out
    table = text[text.index("Paired differences"):]
    rows = [ln.split() for ln in table.splitlines() if ln.split()[:1] in (["weak"], ["strong"],
                                                                           ["z"])]
    # shown: only cells with a paired task (slice z has none; K=4 at 50% has none either)
    assert rows and all("—" not in r for r in rows), rows
    assert {r[0] for r in rows} == {"weak", "strong"}
    assert "cell(s) with no paired task are not shown" in table
    analyze(str(log), "--json", "--k", "1,2", "--tiers", "50,100", "--by", "m",
            "--compare", "disclosure=disclosed,hidden")
    cells = json.loads(capsys.readouterr().out)["compare"]
    assert any(c["diff"] is None for c in cells)  # the JSON keeps every cell
    assert all(c["p_adjusted"] is None for c in cells if c["diff"] is None)


@pytest.mark.parametrize("method", ["holm", "bh", "none"])
def test_compare_adjusts_over_the_cells_and_says_how(
    method: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = _moderate(tmp_path)
    argv = [str(log), "--k", "1,2,4", "--tiers", "50,100", "--by", "m",
            "--compare", "disclosure=disclosed,hidden", "--adjust", method]
    assert analyze(*argv, "--json") == 0
    out = json.loads(capsys.readouterr().out)
    assert out["settings"]["adjust"] == method
    cells = [c for c in out["compare"] if c["diff"] is not None]
    raw = [1.0 if c["p_value"] is None else c["p_value"] for c in cells]
    assert [c["p_adjusted"] for c in cells] == pytest.approx(adjust_p(raw, method))
    for c in cells:
        assert c["adjust"] == method
        if method == "none":
            assert c["significant"] == c["excludes_zero"]
        else:
            assert c["significant"] == (c["excludes_zero"] and c["p_adjusted"] < 0.05)
    assert analyze(*argv) == 0
    table = capsys.readouterr().out
    starred = sum(ln.rstrip().endswith(("*", "*†")) for ln in table.splitlines()
                  if ln.startswith(("weak", "strong")))
    assert starred == sum(c["significant"] for c in cells)
    assert ("adjustment over the" in table) is (method != "none")
    assert ADJUSTMENTS[method].split(" (")[0] in table or method == "none"


def test_holm_stars_fewer_cells_than_unadjusted_intervals(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = _moderate(tmp_path)
    counts = {}
    for method in ("none", "bh", "holm"):
        analyze(str(log), "--json", "--k", "1,2,4", "--tiers", "50,100", "--by", "m",
                "--compare", "disclosure=disclosed,hidden", "--adjust", method)
        counts[method] = sum(c["significant"]
                             for c in json.loads(capsys.readouterr().out)["compare"])
    assert counts["none"] >= counts["bh"] > counts["holm"] >= 1, counts


def test_adjust_p_by_hand() -> None:
    ps = [0.01, 0.04, 0.03, 0.005]
    assert adjust_p(ps, "holm") == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert adjust_p(ps, "bh") == pytest.approx([0.02, 0.04, 0.04, 0.02])
    assert adjust_p(ps, "none") == ps
    assert adjust_p([0.9, 0.8], "holm") == [1.0, 1.0]
