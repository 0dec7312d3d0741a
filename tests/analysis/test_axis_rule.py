"""The eligibility rule along any axis against brute force: over every small trajectory and
every set of enforced budgets, an eligible episode's success within a cell is exactly what
its uncapped run would have shown; a rule that ignores the other axes is not."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from budgetproxy.analysis.axis_rule import AXES, AxisEpisode, eligible, succeeded_within

Turn = tuple[int, int, int]  # input tokens, output tokens the model would write, seconds
STEPS: list[Turn] = [(1, 2, 1), (3, 5, 2)]


def trajectories() -> Iterator[tuple[list[Turn], int | None]]:
    for n in (1, 2, 3):
        for steps in itertools.product(STEPS, repeat=n):
            for success in [None, *range(1, n + 1)]:
                yield list(steps), success


def observe(steps: list[Turn], success: int | None,
            budgets: dict[str, float | None]) -> AxisEpisode:
    """The run under `budgets` as the proxy enforces them (hidden: the agent acts as uncapped):
    a call goes out while turns, tokens and time are left; its output is clamped to the
    tokens left (a clamped answer is cut short: no success); one running past the time
    budget is ended (no success)."""
    bt, btok, bsec = budgets["turns"], budgets["tokens"], budgets["seconds"]
    tok = sec = 0
    spend: dict[str, float | None] = {}
    won = False
    for t, (tin, out, dt) in enumerate(steps, 1):
        if (bt is not None and t > bt) or (btok is not None and tok >= btok) or (
                bsec is not None and sec >= bsec):
            break
        clamped = btok is not None and out > btok - tok
        timed = bsec is not None and sec + dt > bsec
        tok += tin + (int(min(out, btok - tok)) if btok is not None else out)
        sec = int(min(sec + dt, bsec)) if bsec is not None else sec + dt
        if t == success and not clamped and not timed:
            won, spend = True, {"turns": t, "tokens": tok, "seconds": sec}
            break
        if clamped or timed:
            break
    return AxisEpisode("task", "hidden", budgets, won, spend)


def truth(steps: list[Turn], success: int | None, axis: str, b: float,
          hold: dict[str, float | None]) -> bool:
    """Success within the cell, read off the uncapped run."""
    if success is None:
        return False
    tok = sum(tin + out for tin, out, _ in steps[:success])
    sec = sum(dt for _, _, dt in steps[:success])
    spend = {"turns": success, "tokens": tok, "seconds": sec}
    levels = {**hold, axis: b}
    return all(level is None or spend[y] <= level for y, level in levels.items())


BUDGETS = {"turns": [1, 2, 3], "tokens": [None, 3, 6, 10], "seconds": [None, 2, 4]}
LEVELS = {"turns": [1, 2, 3], "tokens": [None, 3, 6, 10], "seconds": [None, 2, 4]}


def cells() -> Iterator[tuple[str, float, dict[str, float | None]]]:
    for axis in ("turns", "tokens", "seconds"):
        others = [y for y in ("turns", "tokens", "seconds") if y != axis]
        for b in [v for v in LEVELS[axis] if v is not None]:
            for levels in itertools.product(*(LEVELS[y] for y in others)):
                yield axis, b, {**dict(zip(others, levels, strict=True)), "cost": None}


def test_eligible_episodes_show_what_their_uncapped_run_would_have() -> None:
    checked = naive_wrong = 0
    all_cells = list(cells())
    for steps, success in trajectories():
        for enforced in itertools.product(*BUDGETS.values()):
            budgets = {**dict(zip(BUDGETS, enforced, strict=True)), "cost": None}
            ep = observe(steps, success, budgets)
            for axis, b, hold in all_cells:
                expected = truth(steps, success, axis, b, hold)
                if eligible(ep, axis, b, hold):
                    assert succeeded_within(ep, axis, b, hold) == expected, (
                        steps, success, budgets, axis, b, hold)
                    checked += 1
                elif (budgets[axis] is None or budgets[axis] >= b) and (
                        succeeded_within(ep, axis, b, hold) != expected):
                    naive_wrong += 1  # counted by "own budget on the axis >= B" alone
    assert checked > 10_000
    assert naive_wrong > 0  # the other axes' budgets matter


def test_disclosed_episodes_count_only_at_their_own_budgets() -> None:
    budgets = {"turns": 4, "tokens": 100, "seconds": None, "cost": None}
    ep = AxisEpisode("t", "disclosed", budgets, True, {"turns": 2, "tokens": 50})
    hold = {"turns": 4, "seconds": None, "cost": None}
    assert eligible(ep, "tokens", 100, hold)
    assert not eligible(ep, "tokens", 200, hold) and not eligible(ep, "tokens", 50, hold)
    told = AxisEpisode("t", "disclosed", budgets, True, {}, announced={"tokens": 200})
    assert not eligible(told, "tokens", 100, hold)
    assert set(AXES) == {"turns", "tokens", "cost", "seconds"}
