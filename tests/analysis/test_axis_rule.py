"""The eligibility rule along any axis against brute force: over every small trajectory and
every set of enforced budgets, an eligible episode's success within a cell is exactly what
its uncapped run would have shown; a rule that ignores the other axes is not. The same for
tiers (B = p% of each episode's full budget on the axis), and the tier columns' per-task
counts against a count from the definitions."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st

from budgetproxy.analysis.axis_rule import AXES, AxisEpisode, Column, eligible, succeeded_within
from budgetproxy.analysis.axis_table import task_counts

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


# ---- tiers: B is p% of each episode's full budget on the axis --------------------------------

TIERS = [Fraction(25), Fraction(50), Fraction(75), Fraction(100)]
MAX_TURNS = [3, 4]  # the full budget on turns; on tokens and seconds it is the own budget


def tier_b(axis: str, p: Fraction, budgets: dict[str, float | None], max_turns: int
           ) -> float | None:
    """B of tier p for one episode, from the definition (turns as the turn table rounds,
    tokens as BudgetMix rounds its draws: to the nearest whole token, at least 1)."""
    if axis == "turns":
        return max(1, math.floor(p * max_turns / 100 + Fraction(1, 2)))
    own = budgets[axis]
    if own is None:
        return None
    b = p * Fraction(str(own)) / 100
    return float(max(1, round(b))) if axis == "tokens" else float(b)


def observed(steps: list[Turn], success: int | None, budgets: dict[str, float | None],
             max_turns: int, task: str = "task") -> AxisEpisode:
    ep = observe(steps, success, budgets)
    full = {**budgets, "turns": float(max_turns)}
    return AxisEpisode(task, "hidden", budgets, ep.success, ep.spend_at_success, full=full)


def test_in_a_tier_eligible_episodes_show_what_their_uncapped_run_would_have() -> None:
    """The tier rule is the cell rule at each episode's own B: exact for every trajectory,
    budget set, tier and level of the other axes; a tier rule that looks at the analysed
    axis alone (every episode with a full budget counts) is not."""
    checked = naive_wrong = 0
    for steps, success in trajectories():
        for enforced in itertools.product(*BUDGETS.values()):
            budgets = {**dict(zip(BUDGETS, enforced, strict=True)), "cost": None}
            for max_turns in MAX_TURNS:
                ep = observed(steps, success, budgets, max_turns)
                for axis in ("turns", "tokens", "seconds"):
                    others = [y for y in ("turns", "tokens", "seconds") if y != axis]
                    for p in TIERS:
                        b = tier_b(axis, p, budgets, max_turns)
                        col = Column("tier", p).budget_of(ep, axis)
                        assert col == b, (axis, p, budgets, max_turns)
                        if b is None:
                            continue
                        for levels in itertools.product(*(LEVELS[y] for y in others)):
                            hold = {**dict(zip(others, levels, strict=True)), "cost": None}
                            expected = truth(steps, success, axis, b, hold)
                            got = succeeded_within(ep, axis, b, hold)
                            if eligible(ep, axis, b, hold):
                                assert got == expected, (steps, success, budgets, axis, p, hold)
                                checked += 1
                            elif got != expected:
                                naive_wrong += 1
    assert checked > 20_000
    assert naive_wrong > 0


TRAJECTORIES = list(trajectories())
BUDGET_SETS = list(itertools.product(*BUDGETS.values()))


@given(
    st.lists(st.tuples(st.sampled_from(["t1", "t2"]), st.integers(0, len(TRAJECTORIES) - 1),
                       st.integers(0, len(BUDGET_SETS) - 1), st.sampled_from(MAX_TURNS)),
             min_size=1, max_size=14),
    st.sampled_from(["turns", "tokens", "seconds"]),
    st.sampled_from(TIERS),
    st.dictionaries(st.sampled_from(["turns", "tokens", "seconds"]),
                    st.sampled_from([None, 2, 3, 6]), max_size=1),
)
@settings(max_examples=300, deadline=None)
def test_tier_counts_equal_brute_force(
        drawn: list[tuple[str, int, int, int]], axis: str, p: Fraction,
        fixed: dict[str, float | None]) -> None:
    """Per level of the other axes and per task, the tier column's (n, c) are the episodes
    with a full budget on the axis whose budgets meet the cell (hidden: at least each level,
    none where the level is none; B being p% of the episode's own full budget) and, of
    those, the ones whose uncapped run succeeded within that B and the levels."""
    fixed = {y: v for y, v in fixed.items() if y != axis}
    runs, eps = [], []
    for task, ti, bi, max_turns in drawn:
        steps, success = TRAJECTORIES[ti]
        budgets = {**dict(zip(BUDGETS, BUDGET_SETS[bi], strict=True)), "cost": None}
        runs.append((task, steps, success, budgets, max_turns))
        eps.append(observed(steps, success, budgets, max_turns, task))
    order, counts = task_counts(eps, axis, [Column("tier", p)], fixed, ())
    others = [y for y in AXES if y != axis]
    holds = {tuple(fixed.get(y, budgets[y]) if y in fixed else budgets[y] for y in others)
             for _, _, _, budgets, _ in runs}
    assert {tuple(h[y] for y in others) for _, h in order} == holds
    for _, hold in order:
        want: dict[str, tuple[int, int]] = {}
        for task, steps, success, budgets, max_turns in runs:
            b = tier_b(axis, p, budgets, max_turns)
            if b is None:
                continue
            levels = {**hold, axis: b}
            ok = all(budgets[y] is None or (levels[y] is not None and budgets[y] >= levels[y])
                     for y in AXES)
            n, c = want.get(task, (0, 0))
            want[task] = (n + ok, c + (ok and truth(steps, success, axis, b, hold)))
        got = counts.get(((), tuple(hold[y] for y in others), 0, None), {})
        assert got == want, (hold, runs)
