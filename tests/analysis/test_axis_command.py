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
    for _ in range(n_calls):
        c.chat.completions.create(model="m1", messages=[{"role": "user",
                                                         "content": "one two three"}])
    r = p.http().post(f"/v1/episodes/{eid}/outcome", json={"success": success})
    assert r.status_code == 200
    return eid


def test_pass_at_budgets_along_tokens(proxy: ProxyFactory, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    p = proxy({"trajectories": {"dir": str(tmp_path)}}, fresh=True)
    # each call spends 3 prompt + 5 completion tokens ("echo: one two three")
    _run_episode(p, "a", 1, True, **{"X-Episode-Token-Budget": "100"})   # 8 tokens
    _run_episode(p, "a", 3, True, **{"X-Episode-Token-Budget": "100"})   # 24 tokens
    _run_episode(p, "b", 2, True)                                        # 16, turn-only
    _run_episode(p, "b", 1, False)
    p.wait_records(4, type="episode")
    code = main([str(tmp_path), "--axis", "tokens", "--budgets", "10,30", "--k", "1",
                 "--hold", "turns=20", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    cells = {c["budget"]: c for c in out["pass_at"]}
    assert all(c["axis"] == "tokens" for c in out["pass_at"])
    # task a: 2 eligible (token budget 100 >= B), successes within 10: one, within 30: both;
    # task b: the turn-only ones have no token cap: eligible; one success at 16 tokens
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


def test_axis_without_budgets_is_a_usage_error(tmp_path: Path) -> None:
    assert main([str(tmp_path), "--axis", "tokens"]) == 2
    (tmp_path / "x.jsonl").write_text("")
    assert main([str(tmp_path), "--budgets", "10", "--report", str(tmp_path / "r.html")]) == 2
