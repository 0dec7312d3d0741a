"""'What this shows': the demo's findings, computed from the Pass@(K,T) cells and the episodes.

Nothing here is asserted in advance: each sentence reads numbers from the analysis output
(``budgetproxy analyze --json``) and the agents' results, and says what they show, including
when an expected effect did not appear.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from budgetproxy.demo.agents import EpisodeResult

TIGHT, LOOSE = "25%", "100%"


# The analysis splits the demo's episodes by these fields (the policy is an episode tag).
BY = ("policy", "disclosure")


def cell_values(pass_at: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str, str, int], float]:
    """(policy, disclosure, tier, K) → Pass@(K,T) from ``analyze --json --by policy,disclosure``."""
    out: dict[tuple[str, str, str, int], float] = {}
    for row in pass_at:
        by, tier, value = row.get("by") or {}, row.get("tier"), row.get("value")
        if tier is None or value is None or any(by.get(f) is None for f in BY):
            continue
        out[(str(by[BY[0]]), str(by[BY[1]]), str(tier), int(row["k"]))] = float(value)
    return out


def _f(v: float) -> str:
    return f"{v:.2f}"


def ordering_flip(
    values: Mapping[tuple[str, str, str, int], float], a: str, b: str, k: int = 1
) -> tuple[list[str], bool | None]:
    """Lines comparing policies a and b (hidden arm) at the tight and loose tiers, and whether
    the order flipped (None when a cell is missing)."""
    got = {t: (values.get((a, "hidden", t, k)), values.get((b, "hidden", t, k)))
           for t in (TIGHT, LOOSE)}
    if any(x is None or y is None for x, y in got.values()):
        return [f"{a} vs {b}: not enough episodes for Pass@{k} at {TIGHT} and {LOOSE}"], None
    parts = []
    for tier, (x, y) in got.items():
        assert x is not None and y is not None
        first, second = (a, b) if x >= y else (b, a)
        hi, lo = max(x, y), min(x, y)
        relation = ">" if hi > lo else "="
        parts.append(f"at {tier}: {first} {_f(hi)} {relation} {second} {_f(lo)}")
    (t_a, t_b), (l_a, l_b) = got[TIGHT], got[LOOSE]
    assert t_a is not None and t_b is not None and l_a is not None and l_b is not None
    flipped = (t_a - t_b) * (l_a - l_b) < 0
    verdict = "the order flips" if flipped else "no flip in this run"
    return [f"Pass@{k}, hidden arm, {'; '.join(parts)} — {verdict}."], flipped


def disclosure_effect(
    values: Mapping[tuple[str, str, str, int], float], model: str, tiers: Sequence[str], k: int = 1
) -> tuple[list[str], float | None]:
    """Hidden vs disclosed for one policy per tier; returns the lines and the largest gap."""
    parts, gaps = [], []
    for tier in tiers:
        h, d = values.get((model, "hidden", tier, k)), values.get((model, "disclosed", tier, k))
        if h is None or d is None:
            continue
        gaps.append(d - h)
        parts.append(f"{tier}: disclosed {_f(d)} vs hidden {_f(h)} ({d - h:+.2f})")
    if not parts:
        return [f"{model}: not enough episodes to compare the arms"], None
    return [f"Pass@{k}, {model}, " + "; ".join(parts) + "."], max(gaps, key=abs)


def enforcement(results: Sequence[EpisodeResult]) -> list[str]:
    """How often the proxy refused a turn, per policy and arm of the tier runs."""
    counts: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    for r in results:
        if r.plan.run != "tiers":
            continue
        c = counts[(r.plan.policy, r.plan.disclosure)]
        c[0] += r.exhausted
        c[1] += 1
    total = sum(c[0] for c in counts.values())
    parts = [f"{p} {arm} {n}/{m}" for (p, arm), (n, m) in sorted(counts.items())]
    return [
        f"The proxy refused {total} episodes a turn past their budget (403 "
        f"turn_budget_exhausted): " + ", ".join(parts) + "."
    ]


def budgetmix_groups(results: Sequence[EpisodeResult]) -> list[str]:
    """One line per task: each group's drawn budget (tier) and its successes."""
    groups: dict[str, dict[str, list[EpisodeResult]]] = defaultdict(lambda: defaultdict(list))
    for r in results:
        if r.plan.run == "budgetmix" and r.plan.group is not None:
            groups[r.plan.task.task_id][r.plan.group].append(r)
    if not groups:
        return []
    lines = ["BudgetMix groups (budget-aware, disclosed; the proxy drew one budget per group):"]
    consistent = True
    for task_id, by_group in groups.items():
        parts = []
        for _, members in sorted(by_group.items()):
            budgets = {m.budget for m in members}
            consistent &= len(budgets) == 1
            budget = min(budgets)
            max_turns = members[0].plan.task.max_turns
            won = sum(m.won for m in members)
            parts.append(f"{budget} turns ({100 * budget / max_turns:.0f}%) {won}/{len(members)}")
        lines.append(f"  {task_id}: " + ", ".join(parts))
    if not consistent:
        lines.append("  (some group's episodes got different budgets: see the trajectories)")
    return lines


def what_this_shows(
    pass_at: Iterable[Mapping[str, Any]], results: Sequence[EpisodeResult]
) -> list[str]:
    """The whole summary, as lines of text."""
    values = cell_values(pass_at)
    tiers = sorted({t for _, _, t, _ in values}, key=lambda t: float(t.rstrip("%")))
    ks = sorted({k for *_, k in values})
    lines = ["What this shows (numbers from this run):"]
    flip_lines, flipped = ordering_flip(values, "careful", "recovering", k=1)
    lines += ["- Budget-dependent ordering. " + flip_lines[0]]
    flips_at = [k for k in ks if ordering_flip(values, "careful", "recovering", k)[1]]
    if flipped is not None:
        lines.append(
            f"  The order flips at K = {', '.join(map(str, flips_at))}." if flips_at else
            "  At no K does the order flip in this run."
        )
    disc_lines, gap = disclosure_effect(values, "budget-aware", tiers, k=1)
    lines += ["- Disclosure changes behaviour. " + disc_lines[0]]
    if gap is not None:
        lines.append(
            f"  The largest hidden-vs-disclosed gap is {gap:+.2f}: the policy paces itself by "
            "the budget line the proxy appends, so telling it changes what it does."
            if gap >= 0.1 else
            f"  The largest hidden-vs-disclosed gap is only {gap:+.2f}: no clear effect of "
            "disclosure in this run."
        )
    for control in ("careful", "recovering"):
        control_lines, _ = disclosure_effect(values, control, tiers, k=1)
        if "not enough" not in control_lines[0]:
            lines.append("  Control (ignores the budget line): " + control_lines[0])
    lines += ["- Enforcement. " + enforcement(results)[0]]
    lines += budgetmix_groups(results)
    return lines
