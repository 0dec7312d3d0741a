"""`analyze --axis ... --budgets ...` on logs the real proxy wrote: cells per axis and budget,
spend read from the turn records (and summed from usage for turn-only episodes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from budgetproxy.analysis.command import main
from tests.conftest import Proxy, ProxyFactory, new_id


def _run_episode(p: Proxy, task: str, n_calls: int, success: bool, **headers: str) -> str:
    eid = new_id()
    c = p.client(default_headers={"X-Episode-Id": eid, "X-Episode-Task": task, **headers})
    for n in range(n_calls):
        # a body of its own per call (a repeated body is a free retry of the same turn)
        c.chat.completions.create(model="m1", messages=[{"role": "user",
                                                         "content": f"one two call{n}"}])
    r = p.http().post(f"/v1/episodes/{eid}/outcome", json={"success": success})
    assert r.status_code == 200
    return eid


def test_pass_at_budgets_along_tokens(proxy: ProxyFactory, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    p = proxy({"trajectories": {"dir": str(tmp_path)}}, fresh=True)
    # each call spends 3 prompt + 4 completion tokens (the fake counts words: "echo: ...")
    _run_episode(p, "a", 1, True, **{"X-Episode-Token-Budget": "100"})   # 7 tokens
    _run_episode(p, "a", 3, True, **{"X-Episode-Token-Budget": "100"})   # 21 tokens
    _run_episode(p, "b", 2, True)                                        # 14, turn-only
    _run_episode(p, "b", 1, False)
    p.wait_records(4, type="episode")
    code = main([str(tmp_path), "--axis", "tokens", "--budgets", "10,30", "--k", "1",
                 "--hold", "turns=20", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    cells = {c["budget"]: c for c in out["pass_at"]}
    assert all(c["axis"] == "tokens" for c in out["pass_at"])
    # task a: 2 eligible (token budget 100 >= B), successes within 10: one, within 30: both;
    # task b: the turn-only ones have no token cap: eligible; one success at 14 tokens
    assert cells[10]["value"] == pytest.approx((0.5 + 0.0) / 2)
    assert cells[30]["value"] == pytest.approx((1.0 + 0.5) / 2)
    assert cells[30]["n_tasks"] == 2 and cells[30]["hold"]["turns"] == 20


    # --by splits the cells: task a alone, then task b
    code = main([str(tmp_path), "--axis", "tokens", "--budgets", "30", "--k", "1",
                 "--hold", "turns=20", "--by", "task_id", "--json"])
    split = json.loads(capsys.readouterr().out)["pass_at"]
    assert code == 0
    assert [(c["by"], c["value"]) for c in split] == [({"task_id": "a"}, 1.0),
                                                      ({"task_id": "b"}, 0.5)]


def test_tiers_and_paired_differences_along_tokens(
        proxy: ProxyFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = proxy({"trajectories": {"dir": str(tmp_path)}}, fresh=True)
    hidden40 = {"X-Episode-Token-Budget": "40"}
    hidden80 = {"X-Episode-Token-Budget": "80"}
    # 7 tokens a call; the full budget on tokens is each episode's own token budget
    _run_episode(p, "a", 1, True, **hidden40)    # 7
    _run_episode(p, "a", 3, True, **hidden40)    # 21
    _run_episode(p, "a", 2, False, **hidden40)
    _run_episode(p, "b", 4, True, **hidden80)    # 28
    _run_episode(p, "b", 1, True, **hidden80)    # 7
    _run_episode(p, "b", 2, True)                # 14, no token budget: in no tier
    told = {"X-Episode-Disclosure": "disclosed"}
    _run_episode(p, "a", 1, True, **hidden40, **told)
    _run_episode(p, "a", 1, True, **hidden40, **told)
    _run_episode(p, "b", 1, True, **hidden80, **told)
    _run_episode(p, "b", 1, False, **hidden80, **told)
    p.wait_records(10, type="episode")
    code = main([str(tmp_path), "--axis", "tokens", "--tiers", "25,50,100", "--budgets", "25",
                 "--k", "1", "--by", "disclosure", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    got = {(c["by"]["disclosure"], c["tier"] or c["budget"]): c for c in out["pass_at"]}
    # hidden, a at B = 10/20/40 of its 40: 1/3, 1/3, 2/3; b at 20/40/80 of 80: 1/2, 1, 1
    assert got[("hidden", "25%")]["value"] == pytest.approx((1 / 3 + 1 / 2) / 2)
    assert got[("hidden", "50%")]["value"] == pytest.approx((1 / 3 + 1) / 2)
    assert got[("hidden", "100%")]["value"] == pytest.approx((2 / 3 + 1) / 2)
    assert got[("hidden", "100%")]["budget"] is None
    assert got[("hidden", "100%")]["axis"] == "tokens"
    # at an absolute 25 the one without a token budget counts (no cap >= 25): b is 2 of 3
    assert got[("hidden", 25.0)]["value"] == pytest.approx((2 / 3 + 2 / 3) / 2)
    # disclosed episodes were told their whole budget: they count at 100% only
    assert got[("disclosed", "100%")]["value"] == pytest.approx((1 + 1 / 2) / 2)
    assert got[("disclosed", "50%")]["value"] is None
    assert all(c["ci_low"] <= c["value"] <= c["ci_high"] for c in out["pass_at"]
               if c["value"] is not None)
    assert out["episodes"] == {"counted": 10, "left_out": 0, "left_out_reasons": {},
                               "not_in_tiers": 1}
    assert out["settings"]["tiers"] == ["25%", "50%", "100%"]

    code = main([str(tmp_path), "--axis", "tokens", "--tiers", "50,100", "--k", "1",
                 "--compare", "disclosure=disclosed,hidden", "--json"])
    rows = {r["tier"]: r for r in json.loads(capsys.readouterr().out)["compare"]}
    assert code == 0
    # 100%: a 1 − 2/3, b 1/2 − 1; at 50% no disclosed episode counts, both tasks unpaired
    assert rows["100%"]["diff"] == pytest.approx(((1 - 2 / 3) + (1 / 2 - 1)) / 2)
    assert (rows["100%"]["a_value"], rows["100%"]["b_value"]) == pytest.approx(
        (3 / 4, 5 / 6))
    assert rows["100%"]["n_tasks"] == 2 and rows["100%"]["axis"] == "tokens"
    assert rows["50%"]["diff"] is None and rows["50%"]["n_tasks_unpaired"] == 2

    code = main([str(tmp_path), "--axis", "tokens", "--tiers", "100", "--k", "1",
                 "--compare", "disclosure=disclosed,hidden"])
    text = capsys.readouterr().out
    assert code == 0
    assert "1 episodes without a budget on tokens: not in tier columns" in text
    assert "Pass@(K,B) along tokens in %" in text and "tier/B (tokens)" in text
    assert "Paired differences, disclosure: disclosed − hidden" in text
    diffs = text.split("Paired differences")[1]
    line = next(x for x in diffs.splitlines() if x.startswith("20  ") and "100%" in x)
    assert "-8.3 [" in line, line


def test_tiers_along_tokens_are_of_the_budgetmix_full_budget(
        proxy: ProxyFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """With BudgetMix drawing over tokens, the episode record names the full token budget
    (budget.budgetmix.max_tokens) and tiers are of it, as turn tiers are of max_turns."""
    p = proxy({"trajectories": {"dir": str(tmp_path)},
               "budget": {"sampler": "budgetmix",
                          "budgetmix": {"max_turns": 20, "step": 0.5, "max_tokens": 40}}},
              fresh=True)
    turns = {"X-Episode-Budget": "20"}
    _run_episode(p, "a", 2, True, **turns, **{"X-Episode-Token-Budget": "40"})  # 14 tokens
    _run_episode(p, "a", 4, True, **turns, **{"X-Episode-Token-Budget": "40"})  # 28
    _run_episode(p, "a", 2, True, **turns, **{"X-Episode-Token-Budget": "20"})  # 14
    records = p.wait_records(3, type="episode")
    assert {r["full_token_budget"] for r in records} == {40}
    assert not any("full_cost_budget" in r or "full_time_budget_s" in r for r in records)
    code = main([str(tmp_path), "--axis", "tokens", "--tiers", "50,100", "--k", "1",
                 "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    cells = {c["tier"]: c for c in out["pass_at"]}
    # 50% of 40 = 20 tokens: all three count (budgets 40, 40, 20 >= 20), two spent <= 20;
    # 100% = 40: the episode capped at 20 could have been cut before 40, so it is left out
    assert cells["50%"]["value"] == pytest.approx(2 / 3)
    assert cells["50%"]["n_episodes"] == 3
    assert cells["100%"]["value"] == pytest.approx(1.0)
    assert cells["100%"]["n_episodes"] == 2


@pytest.mark.parametrize("argv, message", [
    (["--axis", "tokens"], "--axis tokens needs --budgets B1,B2,... or --tiers P1,P2,..."),
    (["--budgets", "10", "--report", "r.html"], "does not combine with --report"),
    (["--axis", "cost", "--tiers", "50", "--turns", "4"], "does not combine with --turns"),
    (["--axis", "tokens", "--budgets", "10", "--to-parquet", "out"],
     "does not combine with --to-parquet"),
    (["--axis", "tokens", "--tiers", "50", "--hold", "tokens=5"],
     "tokens is the analysed axis"),
    (["--axis", "tokens", "--tiers", "50", "--hold", "turns=lots"], "--hold: expected"),
])
def test_what_an_axis_does_not_combine_with_is_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str],
        message: str) -> None:
    (tmp_path / "x.jsonl").write_text("")
    assert main([str(tmp_path), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
