"""Groups: BudgetMix budgets and mixed disclosure arms shared by (task_id, group), deterministic."""

from __future__ import annotations

from typing import Any

import httpx
from conftest import Proxy, ProxyFactory, chat_body, new_id

from budgetproxy.core.budget import budgetmix_candidates

BUDGETMIX = {"budget": {"sampler": "budgetmix", "seed": 11,
                        "budgetmix": {"max_turns": 20, "step": 0.1}}}


def start(p: Proxy, eid: str, **headers: str) -> httpx.Response:
    with p.http() as http:
        r = http.post("/v1/chat/completions", json=chat_body(),
                      headers={"X-Episode-Id": eid, **headers})
    assert r.status_code == 200, r.text
    return r


def create(p: Proxy, **body: Any) -> dict[str, Any]:
    with p.http() as http:
        r = http.post("/v1/episodes", json=body)
    assert r.status_code == 201, r.text
    data: dict[str, Any] = r.json()
    return data


def group_budgets(p: Proxy, task: str, groups: int, per_group: int) -> dict[str, set[int]]:
    out: dict[str, set[int]] = {}
    for g in range(groups):
        for _ in range(per_group):
            eid = new_id()
            start(p, eid, **{"X-Episode-Task": task, "X-Episode-Group": f"g{g}"})
            out.setdefault(f"g{g}", set()).add(p.episode(eid)["budget"])
    return out


def test_budgetmix_same_group_same_budget_on_the_grid(proxy: ProxyFactory) -> None:
    p = proxy(BUDGETMIX)
    budgets = group_budgets(p, "task-a", groups=12, per_group=3)
    assert all(len(b) == 1 for b in budgets.values()), budgets
    drawn = {next(iter(b)) for b in budgets.values()}
    grid = set(budgetmix_candidates(20, 0.1))
    assert grid == {2, 4, 6, 8, 10, 12, 14, 16, 18, 20}
    assert drawn <= grid and len(drawn) >= 4
    # POST /v1/episodes draws the same budget for the same group.
    made = create(p, task_id="task-a", group="g0")
    assert made["budget"] == next(iter(budgets["g0"]))
    assert made["max_turns"] == 20
    assert made["tier"] == f"{made['budget'] * 5}%"


def test_budgetmix_depends_on_the_task(proxy: ProxyFactory) -> None:
    p = proxy(BUDGETMIX)
    a = group_budgets(p, "task-x", groups=10, per_group=1)
    b = group_budgets(p, "task-y", groups=10, per_group=1)
    assert a != b


def test_budgetmix_deterministic_across_instances(proxy: ProxyFactory) -> None:
    one = proxy(BUDGETMIX, fresh=True)
    two = proxy(BUDGETMIX, fresh=True)
    assert group_budgets(one, "task-d", 10, 1) == group_budgets(two, "task-d", 10, 1)
    other_seed = proxy({"budget": {**BUDGETMIX["budget"], "seed": 12}}, fresh=True)
    assert group_budgets(other_seed, "task-d", 10, 1) != group_budgets(one, "task-d", 10, 1)


def test_budgetmix_uses_the_episode_max_turns_and_explicit_budget_wins(
    proxy: ProxyFactory,
) -> None:
    p = proxy(BUDGETMIX)
    budgets = set()
    for g in range(10):
        eid = new_id()
        start(p, eid, **{"X-Episode-Task": "t5", "X-Episode-Group": f"h{g}",
                         "X-Episode-Max-Turns": "5"})
        ep = p.episode(eid)
        assert ep["max_turns"] == 5
        budgets.add(ep["budget"])
    assert budgets <= {1, 2, 3, 4, 5}
    eid = new_id()
    start(p, eid, **{"X-Episode-Task": "task-a", "X-Episode-Group": "g0",
                     "X-Episode-Budget": "7"})
    assert p.episode(eid)["budget"] == 7
    assert create(p, task_id="task-a", group="g0", budget=3)["budget"] == 3


def test_mixed_arms_are_shared_by_a_group(proxy: ProxyFactory) -> None:
    p = proxy({"disclosure": {"mode": "mixed", "disclosed_fraction": 0.5}, "budget": {"seed": 3}})
    arms: dict[str, set[str]] = {}
    for g in range(16):
        for _ in range(3):
            eid = new_id()
            r = start(p, eid, **{"X-Episode-Task": "tm", "X-Episode-Group": f"m{g}"})
            arm = p.episode(eid)["disclosure"]
            arms.setdefault(f"m{g}", set()).add(arm)
            assert r.headers["x-episode-id"] == eid
    assert all(len(a) == 1 for a in arms.values()), arms
    assert {next(iter(a)) for a in arms.values()} == {"hidden", "disclosed"}
    # Same seed on another instance: same arms; an explicit arm wins for its episode.
    again = proxy({"disclosure": {"mode": "mixed", "disclosed_fraction": 0.5},
                   "budget": {"seed": 3}}, fresh=True)
    for g in range(16):
        eid = new_id()
        start(again, eid, **{"X-Episode-Task": "tm", "X-Episode-Group": f"m{g}"})
        assert {again.episode(eid)["disclosure"]} == arms[f"m{g}"]
    for arm in ("hidden", "disclosed"):
        eid = new_id()
        start(p, eid, **{"X-Episode-Task": "tm", "X-Episode-Group": "m0",
                         "X-Episode-Disclosure": arm})
        assert p.episode(eid)["disclosure"] == arm


def test_mixed_fraction_edges(proxy: ProxyFactory) -> None:
    for fraction, arm in ((0.0, "hidden"), (1.0, "disclosed")):
        p = proxy({"disclosure": {"mode": "mixed", "disclosed_fraction": fraction}})
        for g in range(5):
            eid = new_id()
            start(p, eid, **{"X-Episode-Group": f"e{g}"})
            assert p.episode(eid)["disclosure"] == arm
