"""Reading episodes for `analyze --axis`: spend at the success turn whatever the log's order,
the success turn's default, and episodes whose spend on the axis cannot be known."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from records_support import episode_record

from budgetproxy.analysis.command import main


def _turn(eid: str, turn: int, attempt: int, tokens: int, model: str = "m",
          cumulative: bool = True) -> dict[str, Any]:
    return {
        "schema": 1, "type": "turn", "episode_id": eid, "turn": turn, "attempt": attempt,
        "ts": f"2026-11-30T10:00:{turn:02d}.{attempt}00Z", "latency_s": 0.5, "model": model,
        "status": "ok", "http_status": 200, "usage": {"prompt_tokens": tokens - 1,
                                                      "completion_tokens": 1},
        "cumulative": {"turns": turn, "tokens": tokens, "cost": None, "seconds": None}
        if cumulative else None,
    }


def _write(path: Path, records: list[dict[str, Any]]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    main(list(argv))
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


def _values(out: dict[str, Any]) -> list[float | None]:
    return [c["value"] for c in out["pass_at"]]


def test_a_success_without_success_turn_counts_at_turns_used_on_every_axis(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    records = []
    for i, (won, used) in enumerate([(True, 3), (True, 8), (False, 10), (True, 5)]):
        eid = f"e{i}"
        records.append(episode_record(
            eid, task_id=f"t{i % 2}", budget=10, max_turns=10, turns_used=used,
            outcome="success" if won else "failure", success_turn=None,
            end_reason="success" if won else "failure"))
        records += [_turn(eid, t, 1, 10 * t) for t in range(1, used + 1)]
    log = _write(tmp_path / "log.jsonl", records)
    table = _json(capsys, log, "--tiers", "50,100", "--k", "1", "--json")
    turns = _json(capsys, log, "--axis", "turns", "--tiers", "50,100", "--k", "1", "--json")
    assert _values(turns) == _values(table) == [pytest.approx(0.5), pytest.approx(0.75)]
    # on tokens, each success spent 10 a turn up to its turns_used (3, 8, 5 turns)
    tokens = _json(capsys, log, "--axis", "tokens", "--budgets", "30,50,80", "--k", "1",
                   "--json")
    assert _values(tokens) == [pytest.approx(0.25), pytest.approx(0.5), pytest.approx(0.75)]


@pytest.mark.parametrize("cumulative", [True, False])
def test_spend_at_the_success_turn_is_the_last_answered_attempts_in_any_order(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], cumulative: bool) -> None:
    eid = "retried"
    episode = episode_record(eid, budget=5, max_turns=5, turns_used=1, outcome="success",
                             success_turn=1, end_reason="success")
    first = _turn(eid, 1, 1, 100, cumulative=cumulative)
    second = _turn(eid, 1, 2, 900, cumulative=cumulative)
    a = _write(tmp_path / "a.jsonl", [first])
    b = _write(tmp_path / "b.jsonl", [second, episode])
    both = _write(tmp_path / "both.jsonl", [second, first, episode])
    got = [_values(_json(capsys, *files, "--axis", "tokens", "--budgets", "100,1000",
                         "--k", "1", "--json"))
           for files in ([a, b], [b, a], [both])]
    # with cumulative spend the last answered attempt's (900) decides; summed from usage, both
    # attempts were spent (1,000)
    assert got == [[0.0, 1.0]] * 3


def test_an_unpriced_model_is_left_out_of_the_cost_axis_and_counted(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    records = []
    for i, model in enumerate(["gpt-4o", "no-such-model-anywhere", "gpt-4o"]):
        eid = f"e{i}"
        records.append(episode_record(eid, task_id="t", model=model, budget=5, max_turns=5,
                                      turns_used=1, outcome="success", success_turn=1,
                                      end_reason="success"))
        records.append(_turn(eid, 1, 1, 1000, model=model, cumulative=False))
    log = _write(tmp_path / "log.jsonl", records)
    assert main([log, "--axis", "cost", "--budgets", "1", "--k", "1", "--json"]) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    # the two priced successes count; the unpriced one is in no cell, not a failure
    assert _values(out) == [1.0]
    assert out["pass_at"][0]["n_episodes"] == 2
    assert out["episodes"]["counted"] == 2
    assert out["episodes"]["left_out_reasons"] == {"cost unknown: unpriced model": 1}
    assert "no-such-model-anywhere" in captured.err and "left out" in captured.err
    # --price prices it: then it counts
    out = _json(capsys, log, "--axis", "cost", "--budgets", "1", "--k", "1", "--json",
                "--price", "no-such-model-*=1,2")
    assert out["pass_at"][0]["n_episodes"] == 3 and _values(out) == [1.0]
    # the turns axis needs no price
    out = _json(capsys, log, "--axis", "turns", "--budgets", "1", "--k", "1", "--json")
    assert out["pass_at"][0]["n_episodes"] == 3
    # a malformed price, or a price without --axis, is a usage error
    assert main([log, "--axis", "cost", "--budgets", "1", "--price", "m=1"]) == 2
    assert main([log, "--tiers", "100", "--price", "m=1,2"]) == 2
    assert "--price" in capsys.readouterr().err


def test_an_episode_without_its_turn_records_is_left_out_off_the_turns_axis(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    records = []
    for i in range(3):
        eid = f"e{i}"
        records.append(episode_record(eid, task_id="t", budget=5, max_turns=5, turns_used=2,
                                      outcome="success", success_turn=2, end_reason="success"))
        records += [_turn(eid, t, 1, 10 * t, cumulative=False) for t in (1, 2)[: 1 + (i > 0)]]
    log = _write(tmp_path / "log.jsonl", records)
    out = _json(capsys, log, "--axis", "tokens", "--budgets", "15", "--k", "1", "--json")
    # e0's second turn is not in the log: its 10 tokens would look like a success within 15
    assert out["episodes"]["left_out_reasons"] == {"tokens unknown: turn records missing": 1}
    assert _values(out) == [0.0] and out["pass_at"][0]["n_episodes"] == 2


def _episode(eid: str, task: str, won: bool, **fields: Any) -> dict[str, Any]:
    return episode_record(
        eid, task_id=task, budget=10, max_turns=10, turns_used=2 if won else 10,
        outcome="success" if won else "failure", success_turn=2 if won else None,
        end_reason="success" if won else "failure", **fields)


def test_a_truncated_gz_is_skipped_and_named_as_the_default_path_does(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import gzip

    whole = [_episode("a", "t0", True), *(_turn("a", t, 1, 10 * t) for t in (1, 2)),
             _episode("b", "t1", False), *(_turn("b", t, 1, 10 * t) for t in range(1, 11))]
    (tmp_path / "traj-1.jsonl.gz").write_bytes(
        gzip.compress("".join(json.dumps(r) + "\n" for r in whole).encode()))
    lost = [_episode(f"x{i}", "t2", True) for i in range(40)]
    raw = gzip.compress("".join(json.dumps(r) + "\n" for r in lost).encode())
    (tmp_path / "traj-2.jsonl.gz").write_bytes(raw[:len(raw) // 2])
    code = main([str(tmp_path), "--axis", "tokens", "--budgets", "100", "--k", "1", "--json"])
    captured = capsys.readouterr()
    assert code == 0
    cell = json.loads(captured.out)["pass_at"][0]
    # the readable file's two tasks alone: one success at 20 tokens, one failure
    assert cell["value"] == pytest.approx(0.5) and cell["n_tasks"] == 2
    assert f"skipped unreadable file {tmp_path / 'traj-2.jsonl.gz'}" in captured.err
    assert "Traceback" not in captured.err


def test_records_the_default_path_skips_are_skipped_and_reported(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    records = [_episode(f"f{i}", f"t{i}", False) for i in range(3)]
    records.append(dict(_episode("s", "t3", True), schema=2))  # a schema this reader lacks
    log = _write(tmp_path / "log.jsonl", records)
    default = _json(capsys, log, "--turns", "5", "--k", "1", "--json")
    assert default["inputs"]["skipped_reasons"] == {"unknown schema version 2": 1}
    main([log, "--axis", "turns", "--budgets", "5", "--k", "1", "--json"])
    captured = capsys.readouterr()
    along = json.loads(captured.out)
    assert _values(along) == _values(default) == [0.0]
    assert along["pass_at"][0]["n_tasks"] == default["pass_at"][0]["n_tasks"] == 3
    assert "skipped 1 record(s):" in captured.err
    assert "1 × unknown schema version 2" in captured.err


def test_bad_lines_are_counted_by_reason_along_an_axis(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = [_episode(f"g{i}", f"t{i % 4}", i % 2 == 1) for i in range(8)]
    bad = ["{not json", "[1,2,3]", '{"schema":1}', '{"schema":1,"type":"episode"}',
           '{"schema":1,"type":"turn"}']
    log = tmp_path / "log.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in good[:4]) + "\n".join(bad) + "\n"
                   + "".join(json.dumps(r) + "\n" for r in good[4:]))
    code = main([str(log), "--axis", "turns", "--budgets", "5", "--k", "1", "--json"])
    captured = capsys.readouterr()
    assert code == 0
    cell = json.loads(captured.out)["pass_at"][0]
    assert cell["value"] == pytest.approx(0.5) and cell["n_episodes"] == 8
    assert "skipped 5 record(s):" in captured.err
    for reason in ("not valid JSON (truncated line?)", 'no "schema" field',
                   'no "type" field', "episode record without episode_id",
                   "turn record without episode_id"):
        assert f"1 × {reason}" in captured.err


def test_inputs_and_skips_are_reported_in_json_and_text_as_the_default_path_does(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = [_episode(f"g{i}", f"t{i % 4}", i % 2 == 1) for i in range(8)]
    good.append(_episode("g0", "t0", False))  # a second record of g0: a duplicate, the last kept
    log = tmp_path / "log.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in good[:4]) + "{not json\n"
                   + json.dumps(dict(_episode("s", "t9", True), schema=2)) + "\n"
                   + "".join(json.dumps(r) + "\n" for r in good[4:]))
    default = _json(capsys, str(log), "--turns", "5", "--k", "1", "--json")
    along = _json(capsys, str(log), "--axis", "turns", "--budgets", "5", "--k", "1", "--json")
    inputs = along["inputs"]
    assert inputs == default["inputs"]
    assert inputs["files"] == 1 and inputs["episode_records"] == 9
    assert inputs["duplicate_episode_records"] == 1
    assert inputs["skipped"] == 2
    assert inputs["skipped_reasons"] == {"not valid JSON (truncated line?)": 1,
                                         "unknown schema version 2": 1}
    assert inputs["unreadable_files"] == []
    assert main([str(log), "--turns", "5", "--k", "1"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("read 1 file(s), ") and first.endswith(
        ": 0 turn records, 9 episode records, 2 skipped")
    assert main([str(log), "--axis", "turns", "--budgets", "5", "--k", "1"]) == 0
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert lines[0] == first
    assert lines[1] == "1 duplicate episode records (the last one kept)"
    assert lines[2].startswith("episodes: 8 counted")
    # stderr still names the skips, once
    assert captured.err.count("skipped 2 record(s):") == 1


def test_an_unreadable_file_is_in_the_inputs_along_an_axis(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import gzip

    _write(tmp_path / "a.jsonl", [_episode("a", "t0", True), _episode("b", "t1", False)])
    raw = gzip.compress("".join(json.dumps(_episode(f"x{i}", "t2", True)) + "\n"
                                for i in range(40)).encode())
    (tmp_path / "b.jsonl.gz").write_bytes(raw[:len(raw) // 2])
    out = _json(capsys, str(tmp_path), "--axis", "turns", "--budgets", "5", "--k", "1",
                "--json")
    assert [f["file"] for f in out["inputs"]["unreadable_files"]] == [
        str(tmp_path / "b.jsonl.gz")]
    assert out["inputs"]["skipped"] == 0 and not out["inputs"]["skipped_reasons"]
    assert main([str(tmp_path), "--axis", "turns", "--budgets", "5", "--k", "1"]) == 0
    assert capsys.readouterr().out.startswith("read ")


def _piled_log(path: Path, easy: int, hard: int) -> str:
    """`easy` tasks won in 4 of 5 episodes (Pass@2 exactly 1), `hard` ones in 1 of 5 (0.4)."""
    records = [_episode(f"e{i}-{j}", f"t{i:02d}", j < (4 if i < easy else 1))
               for i in range(easy + hard) for j in range(5)]
    return _write(path, records)


def test_an_axis_cell_with_most_tasks_at_one_is_flagged_piled(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = _piled_log(tmp_path / "piled.jsonl", 9, 3)
    out = _json(capsys, log, "--axis", "turns", "--budgets", "5", "--k", "1,2", "--json")
    k1, k2 = out["pass_at"]
    # 9 of 12 tasks at exactly 1 at K=2; at K=1 they sit at 0.8 and 0.2
    assert k2["value"] == pytest.approx((9 + 3 * 0.4) / 12)
    assert k2["piled"] is True and k2["few_tasks"] is False and k2["ci_note"] is None
    assert k1["piled"] is False
    # the turn table's cell agrees
    table = _json(capsys, log, "--turns", "5", "--k", "1,2", "--json")
    assert [c["piled"] for c in table["pass_at"]] == [False, True]
    assert main([log, "--axis", "turns", "--budgets", "5", "--k", "1,2"]) == 0
    text = capsys.readouterr().out
    row = next(line for line in text.splitlines() if line.startswith("none "))
    assert row.endswith("‡") and row.count("‡") == 1
    assert "‡: at least 3/4 of the tasks' estimates at exactly 1 (or at exactly 0)" in text
    # 8 of 12 at 1: under 3/4, no flag and no note
    spread = _piled_log(tmp_path / "spread.jsonl", 8, 4)
    out = _json(capsys, spread, "--axis", "turns", "--budgets", "5", "--k", "2", "--json")
    assert out["pass_at"][0]["piled"] is False
    assert main([spread, "--axis", "turns", "--budgets", "5", "--k", "2"]) == 0
    assert "‡" not in capsys.readouterr().out
