"""`budgetproxy analyze` end to end: output shapes, report, audit, recovery, errors."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from records_support import episode_record

from budgetproxy.analysis import command
from budgetproxy.analysis.passk import budgetmix_candidates


def episode(eid: str, task: str, group: str | None, budget: int, **fields: Any) -> dict[str, Any]:
    return episode_record(eid, **{
        "task_id": task, "group": group, "tags": {"policy": "rl"}, "budget": budget,
        "tier": f"{budget * 10}%", "turns_used": budget, "exhausted": True,
        "end_reason": "exhausted", **fields})


def budgetmix_log(path: Path, groups_per_task: int = 30, tasks: int = 4) -> Path:
    """Every task draws each candidate budget equally often, 4 episodes per group."""
    grid = budgetmix_candidates(10)
    records = []
    for t in range(tasks):
        for g in range(groups_per_task):
            budget = grid[g % len(grid)]
            arm = "disclosed" if g % 2 else "hidden"
            for e in range(4):
                eid = f"t{t}-g{g}-e{e}"
                if (t + g + e) % 3 == 0:
                    turn = min(budget, 1 + (g + e) % 5)
                    records.append(episode(
                        eid, f"task{t}", f"g{g}", budget, disclosure=arm, outcome="success",
                        end_reason="success", success_turn=turn, turns_used=turn,
                        exhausted=False, reward=1.0,
                    ))  # fmt: skip
                else:
                    records.append(episode(eid, f"task{t}", f"g{g}", budget, disclosure=arm))
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def analyze(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="budgetproxy")
    command.register(parser.add_subparsers())
    args = parser.parse_args(["analyze", *argv])
    code: int = args.func(args)
    return code


def test_json_output_has_the_contract_shape(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = budgetmix_log(tmp_path / "log.jsonl")
    assert analyze(str(log), "--json", "--k", "1,4", "--by", "disclosure") == 0
    out = json.loads(capsys.readouterr().out)
    rows = out["pass_at"]
    assert len(rows) == 2 * 4 * 2  # arms × default tiers × K
    keys = {"k", "tier", "value", "ci_low", "ci_high", "n_tasks", "n_tasks_left_out",
            "n_episodes", "by", "ci_note", "few_tasks", "piled"}  # the contract's, and three more
    assert all(set(r) == keys for r in rows)
    assert [r["tier"] for r in rows[:8:2]] == ["25%", "50%", "75%", "100%"]
    assert {json.dumps(r["by"]) for r in rows} == {'{"disclosure": "disclosed"}',
                                                    '{"disclosure": "hidden"}'}  # fmt: skip
    for r in rows:
        if r["value"] is not None:
            assert 0 <= r["ci_low"] <= r["value"] <= r["ci_high"] <= 1
    assert out["episodes"]["total"] == 4 * 30 * 4
    assert out["inputs"]["skipped"] == 0


def test_turns_instead_of_tiers_and_no_by(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = budgetmix_log(tmp_path / "log.jsonl")
    assert analyze(str(log), "--json", "--turns", "2,4", "--k", "1") == 0
    rows = json.loads(capsys.readouterr().out)["pass_at"]
    assert [(r["turns"], r["by"]) for r in rows] == [(2, {}), (4, {})]
    assert all("tier" not in r for r in rows)


def test_terminal_table_is_aligned(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = budgetmix_log(tmp_path / "log.jsonl")
    assert analyze(str(log), "--by", "disclosure,policy", "--k", "1,2") == 0
    out = capsys.readouterr().out
    table = [line for line in out.splitlines() if line.startswith(("disclosure", "hidden"))]
    header, *body = table
    assert header.split() == ["disclosure", "policy", "tier/T", "tasks", "episodes", "K=1", "K=2"]
    assert len(body) == 4
    # every K=2 column ends where its header ends
    end = header.index("K=2") + len("K=2")
    assert all(len(line) == end for line in body)
    assert re.search(r"\d+\.\d \[(\d+\.\d, \d+\.\d|zero width: [a-z 01]+)\]", body[0])


def test_report_is_self_contained_html_with_svg(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = budgetmix_log(tmp_path / "log.jsonl")
    report = tmp_path / "out" / "report.html"
    assert analyze(str(log), "--report", str(report)) == 0
    html = report.read_text()
    assert html.startswith("<!doctype html>")
    assert html.count("<svg") >= 7  # Pass@T per K (4), success, exhaustion, turns used
    assert "Pass@(4,T)" in html and "Exhaustion by budget tier" in html
    assert "<script" not in html and "<link" not in html
    urls = set(re.findall(r"https?://[^\"' )]+", html))
    assert urls <= {"http://www.w3.org/2000/svg"}


def test_audit_passes_a_budgetmix_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = budgetmix_log(tmp_path / "log.jsonl", groups_per_task=50)
    assert analyze(str(log), "--audit-budgetmix", "--json") == 0
    audit = json.loads(capsys.readouterr().out)["audit"]
    assert audit["ok"] and audit["problems"] == [] and audit["draws"] == 200
    assert audit["p_value"] > 0.5  # perfectly even draws


def test_audit_flags_off_grid_budget_and_split_group(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = budgetmix_log(tmp_path / "log.jsonl")
    with log.open("a") as f:
        f.write(json.dumps(episode("on", "task0", "g-on", 7, max_turns=12)) + "\n")  # 7.2 → 7
        f.write(json.dumps(episode("off", "task0", "g-off", 7, max_turns=20)) + "\n")
        f.write(json.dumps(episode("s1", "task1", "g-split", 4)) + "\n")
        f.write(json.dumps(episode("s2", "task1", "g-split", 6)) + "\n")
    assert analyze(str(log), "--audit-budgetmix") == 1
    out = capsys.readouterr().out
    assert "off the candidate grid" in out and "task task0 group g-off: budget 7" in out
    assert "more than one budget" in out and "task task1 group g-split: budgets 4, 6" in out
    assert "g-on" not in out


def test_audit_flags_non_uniform_draws(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    records = [episode(f"e{i}", f"t{i % 5}", f"g{i}", 10 if i % 2 else 2) for i in range(400)]
    log = tmp_path / "log.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert analyze(str(log), "--audit-budgetmix", "--json") == 1
    audit = json.loads(capsys.readouterr().out)["audit"]
    assert any("not uniform" in p for p in audit["problems"])
    assert audit["p_value"] < 1e-6


def test_audit_groups_leaves_fixed_budget_episodes_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = budgetmix_log(tmp_path / "log.jsonl", groups_per_task=50)
    with log.open("a") as f:  # a fixed-tier run in the same log: 25% of 20 turns, no group
        for i in range(40):
            f.write(json.dumps(episode(f"fixed{i}", f"task{i % 4}", None, 5, max_turns=20)) + "\n")
    assert analyze(str(log), "--audit-budgetmix", "--json") == 1
    audit = json.loads(capsys.readouterr().out)["audit"]
    assert any("off the candidate grid" in p for p in audit["problems"])
    assert any("--audit-groups" in n for n in audit["notes"])  # the way out is named
    assert analyze(str(log), "--audit-groups", "^g[0-9]+$", "--json") == 0  # implies the audit
    audit = json.loads(capsys.readouterr().out)["audit"]
    assert audit["ok"] and audit["draws"] == 200
    assert any("40 others are not" in n for n in audit["notes"])
    assert analyze(str(log), "--audit-groups", "no-such-group") == 1
    assert "nothing to audit" in capsys.readouterr().out
    assert analyze(str(log), "--audit-groups", "(unclosed") == 2
    assert "--audit-groups '(unclosed' is not a valid RE2 regex" in capsys.readouterr().err


def test_audit_verdict_sets_the_exit_status_even_with_no_pass_values(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = budgetmix_log(tmp_path / "log.jsonl", groups_per_task=50)
    records = [json.loads(line) for line in log.read_text().splitlines()]
    for r in records:
        r.update(end_reason="abandoned", outcome=None)
    log.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert analyze(str(log), "--audit-budgetmix") == 0
    captured = capsys.readouterr()
    assert "BudgetMix audit (step 0.1, 200 draws): OK" in captured.out
    assert "no eligible episodes" in captured.err  # still said, but not the audit's verdict
    assert analyze(str(log)) == 1


def test_audit_help_documents_the_group_filter(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        analyze("--help")
    text = " ".join(capsys.readouterr().out.split())
    assert "--audit-groups REGEX" in text and "implies --audit-budgetmix" in text
    assert "the audit's verdict alone sets the exit status" in text


Call = tuple[str, str, str]  # (id, name, arguments)


def tool_calls(*calls: Call) -> list[dict[str, Any]]:
    return [{"id": i, "type": "function", "function": {"name": n, "arguments": a}}
            for i, n, a in calls]  # fmt: skip


def turn(
    eid: str, n: int, echoed: Call | None, result: str | None, call: Call | None, **fields: Any
) -> dict[str, Any]:
    """A turn as the proxy logs it: the request's new messages are the assistant message
    echoing the previous call and that call's tool result; the response makes `call`."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "solve it"}]
    if echoed is not None:
        messages = [
            {"role": "assistant", "content": None, "tool_calls": tool_calls(echoed)},
            {"role": "tool", "tool_call_id": echoed[0], "content": result},
        ]
    record: dict[str, Any] = {
        "schema": 1, "type": "turn", "episode_id": eid, "turn": n, "attempt": 1,
        "status": "ok", "request_messages": messages, "messages_offset": n,
        "response": {"content": None, "tool_calls": tool_calls(call) if call else None},
        "budget": 10, "remaining": 10 - n, "disclosure": {"arm": "hidden", "text": None},
    }  # fmt: skip
    record.update(fields)
    return record


def test_recovery_view(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    q1, q2 = '{"q": "SELECT a"}', '{"q": "SELECT b"}'
    c1, c2 = ("c1", "sql", q1), ("c2", "sql", q2)
    d1, d2 = ("d1", "sql", q1), ("d2", "sql", '{"q":  "SELECT a"}')  # d2 repeats d1
    won = {"outcome": "success", "end_reason": "success", "exhausted": False}
    records = [
        # r: error, then a different call; succeeds
        turn("r", 1, None, None, c1),
        turn("r", 2, c1, "Error: no column a", c2),
        turn("r", 3, c2, "ok: 3 rows", None),
        episode("r", "t1", "g", 10, success_turn=3, turns_used=3, **won),
        # s: error, the same call again (whitespace differs), error again, a text answer
        turn("s", 1, None, None, d1),
        turn("s", 2, d1, "Error: no column a", d2),
        turn("s", 3, d2, "Error: no column a", None),
        episode("s", "t1", "g", 10, turns_used=3, end_reason="failure", exhausted=False),
        # u: no error; succeeds
        turn("u", 1, None, None, c2),
        turn("u", 2, c2, "ok", None),
        episode("u", "t1", "g", 10, success_turn=2, turns_used=2, **won),
        # v: parts-style content; the turn was refused, so no next action to judge
        turn("v", 1, None, None, c1),
        turn("v", 2, c1, None, None, status="rejected", response=None),
        episode("v", "t1", "g", 10, turns_used=2, end_reason="exhausted"),
        # w: a retried turn is judged once, by its answered attempt
        turn("w", 1, None, None, c1),
        turn("w", 2, c1, "Error: x", None, status="upstream_error", response=None),
        turn("w", 2, c1, "Error: x", c2, attempt=2),
        episode("w", "t1", "g", 10, success_turn=2, turns_used=2, **won),
        # x: an error whose call was not echoed: counted, not judged
        turn("x", 1, None, None, c1),
        turn("x", 2, None, None, c2,
             request_messages=[{"role": "tool", "tool_call_id": "c1", "content": "Error: y"}]),
        episode("x", "t1", "g", 10, turns_used=2, end_reason="failure", exhausted=False),
    ]  # fmt: skip
    records[12]["request_messages"][1]["content"] = [{"type": "text", "text": "Error: boom"}]
    log = tmp_path / "log.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert analyze(str(log), "--error-pattern", "^Error:", "--json", "--k", "1") == 0
    (row,) = json.loads(capsys.readouterr().out)["recovery"]
    assert row == {
        "disclosure": "hidden", "model": "m", "episodes": 6, "episodes_with_error": 5,
        "success_after_error": pytest.approx(2 / 5), "success_without_error": 1.0,
        "errors": 6, "errors_with_next_action": 4, "changed_next_action": pytest.approx(3 / 4),
    }  # fmt: skip
    assert analyze(str(log), "--error-pattern", "^Error:", "--k", "1") == 0
    assert "Recovery after tool errors" in capsys.readouterr().out


def _recovery_row(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                  records: list[dict[str, Any]]) -> dict[str, Any]:
    """`analyze --json`'s one recovery row for these records, errors being "Error: ..."."""
    log = tmp_path / "log.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert analyze(str(log), "--error-pattern", "^Error:", "--json", "--k", "1") == 0
    (row,) = json.loads(capsys.readouterr().out)["recovery"]
    assert isinstance(row, dict)
    return row


def test_recovery_counts_an_error_once_when_a_rewrite_logs_it_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A turn after the client rewrote its history logs the whole conversation again
    (messages_offset 0): the tool error an earlier turn already sent is not a new one."""
    c1, c2 = ("c1", "sql", '{"q": "SELECT a"}'), ("c2", "sql", '{"q": "SELECT b"}')
    whole = [
        {"role": "user", "content": "solve it (summarised)"},
        {"role": "assistant", "content": None, "tool_calls": tool_calls(c1)},
        {"role": "tool", "tool_call_id": "c1", "content": "Error: no column a"},
        {"role": "assistant", "content": None, "tool_calls": tool_calls(c2)},
        {"role": "tool", "tool_call_id": "c2", "content": "ok: 3 rows"},
    ]
    records = [
        turn("r", 1, None, None, c1),
        turn("r", 2, c1, "Error: no column a", c2),
        turn("r", 3, None, None, None, request_messages=whole, messages_offset=0),
        episode("r", "t1", "g", 10, success_turn=3, turns_used=3, outcome="success",
                end_reason="success", exhausted=False),
    ]
    row = _recovery_row(tmp_path, capsys, records)
    assert (row["errors"], row["errors_with_next_action"], row["changed_next_action"]) == (
        1, 1, 1.0)


def test_recovery_counts_every_error_when_call_ids_repeat_across_responses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Many models number their calls per response (call_0, call_1, ...): two errors of two
    different turns may share an id, and both count."""
    a, b = ("call_0", "sql", '{"q": "SELECT a"}'), ("call_0", "sql", '{"q": "SELECT b"}')
    done = ("call_1", "sql", '{"q": "SELECT c"}')
    records = [
        turn("n", 1, None, None, a),
        turn("n", 2, a, "Error: no column a", b),
        turn("n", 3, b, "Error: no column b", done),
        episode("n", "t1", "g", 10, success_turn=3, turns_used=3, outcome="success",
                end_reason="success", exhausted=False),
    ]
    row = _recovery_row(tmp_path, capsys, records)
    assert (row["errors"], row["errors_with_next_action"]) == (2, 2)


def test_empty_input_says_so_and_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert analyze(str(tmp_path)) == 1
    assert "no trajectory logs" in capsys.readouterr().err
    (tmp_path / "turns.jsonl").write_text(json.dumps(turn("a", 1, None, None, None)) + "\n")
    assert analyze(str(tmp_path)) == 1
    assert "no episode records" in capsys.readouterr().err


def test_no_eligible_episodes_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "log.jsonl"
    log.write_text(json.dumps(episode("a", "t", "g", 3, end_reason="abandoned")) + "\n")
    assert analyze(str(log), "--json") == 1
    captured = capsys.readouterr()
    assert all(r["value"] is None for r in json.loads(captured.out)["pass_at"])
    assert "no eligible episodes" in captured.err


def test_bad_regex_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = budgetmix_log(tmp_path / "log.jsonl", tasks=1)
    assert analyze(str(log), "--error-pattern", "(unclosed") == 2
    assert "not a valid RE2 regex" in capsys.readouterr().err


def test_skipped_lines_are_reported_on_stderr(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = budgetmix_log(tmp_path / "log.jsonl", tasks=1)
    with log.open("a") as f:
        f.write('{"schema": 1, "type": "episo\nnot json\n')
    assert analyze(str(log), "--json") == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["inputs"]["skipped"] == 2
    assert "skipped 2 record(s)" in captured.err and "not valid JSON" in captured.err


def run_cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "budgetproxy", "analyze", *argv],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_cli_subprocess_end_to_end(tmp_path: Path) -> None:
    log = budgetmix_log(tmp_path / "log.jsonl", tasks=2)
    done = run_cli(str(log), "--json", "--k", "1,2", "--turns", "3")
    assert done.returncode == 0, done.stderr
    assert [r["k"] for r in json.loads(done.stdout)["pass_at"]] == [1, 2]
    missing = run_cli(str(tmp_path / "missing.jsonl"))
    assert missing.returncode == 2
    assert missing.stderr.strip().count("\n") == 0 and "Traceback" not in missing.stderr
    assert "no such file or directory" in missing.stderr


def test_importing_the_command_is_cheap() -> None:
    code = (
        "import sys, budgetproxy.analysis.command; "
        "print(sorted(m for m in ('duckdb', 'numpy') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "[]"


def test_unknown_by_field_is_warned_about(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = budgetmix_log(tmp_path / "log.jsonl", tasks=1)
    assert analyze(str(log), "--by", "polcy", "--k", "1") == 0
    assert "--by polcy: no episode has this field or tag" in capsys.readouterr().err


def test_report_carries_audit_and_recovery_sections(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = budgetmix_log(tmp_path / "log.jsonl", tasks=1)
    report = tmp_path / "report.html"
    argv = [str(log), "--report", str(report), "--audit-budgetmix", "--error-pattern", "Error"]
    assert analyze(*argv, "--by", "policy") == 0
    html = report.read_text()
    assert "BudgetMix audit" in html and "Recovery after tool errors" in html
    assert "rl" in html  # the --by slice names the series


def test_json_is_byte_identical_across_runs_with_the_same_seed(tmp_path: Path) -> None:
    import random

    rnd = random.Random(3)
    records = []
    for t in range(40):
        for e in range(6):
            won = rnd.random() < 0.5
            records.append(episode_record(
                f"t{t}-e{e}", task_id=f"task{t}", budget=10, max_turns=10,
                disclosure=rnd.choice(["hidden", "disclosed"]),
                outcome="success" if won else "failure",
                end_reason="success" if won else "failure",
                success_turn=rnd.randint(1, 10) if won else None))  # fmt: skip
    log = tmp_path / "log.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in records))
    outputs = set()
    for _ in range(4):  # separate processes: DuckDB schedules its threads anew each time
        done = subprocess.run(
            [sys.executable, "-m", "budgetproxy", "analyze", str(log), "--json", "--by",
             "disclosure", "--audit-budgetmix", "--compare", "disclosure=disclosed,hidden"],
            capture_output=True, timeout=60,
        )
        assert done.returncode in (0, 1), done.stderr
        outputs.add(done.stdout)
    assert len(outputs) == 1


@pytest.mark.parametrize(
    ("step", "max_turns"), [("0.4", 10), ("0.15", 10), ("0.3", 7), ("0.1", 20)]
)
def test_audit_accepts_the_proxys_own_draws(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], step: str, max_turns: int
) -> None:
    # The budgets the proxy's sampler really draws, for steps that do not divide 1 too: the
    # audit checks them against the same grid (capped at max_turns), so none is off-grid.
    from budgetproxy.core.budget import draw_budgetmix

    records = []
    for t in range(4):
        for g in range(250):
            budget = draw_budgetmix(0, f"task{t}", f"g{g}", max_turns, float(step))
            records += [
                episode(f"t{t}-g{g}-e{e}", f"task{t}", f"g{g}", budget, max_turns=max_turns)
                for e in range(2)
            ]
    log = tmp_path / "log.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in records))
    code = analyze(str(log), "--json", "--audit-budgetmix", "--budgetmix-step", step)
    audit = json.loads(capsys.readouterr().out)["audit"]
    assert audit["problems"] == [] and code == 0
    assert audit["p_value"] is not None and audit["p_value"] > 0.01


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--resamples", "0"), ("--resamples", "-5"), ("--seed", "-1"), ("--seed", "x"),
        ("--budgetmix-alpha", "2"), ("--budgetmix-alpha", "-1"), ("--budgetmix-alpha", "0"),
        ("--tiers", "1e400"), ("--tiers", "150"), ("--tiers", "0"), ("--tiers", "nan"),
        ("--k", "0"), ("--k", "1,x"), ("--turns", "0"), ("--turns", "99999999999"),
        ("--budgetmix-step", "0"), ("--budgetmix-step", "1.5"), ("--budgetmix-step", "1e-400"),
        ("--memory-limit", "lots"), ("--compare", "disclosure"), ("--resamples", "1e9"),
    ],
)  # fmt: skip
def test_bad_arguments_exit_2_with_one_line_naming_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, value: str
) -> None:
    log = tmp_path / "log.jsonl"
    log.write_text(json.dumps(episode_record("e1")) + "\n")
    with pytest.raises(SystemExit) as exit_:
        analyze(str(log), f"{flag}={value}")
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("budgetproxy analyze: "), err
    assert flag in err, err
