"""'What this shows': the demo's findings, read from the analysis and the episodes' results.

Nothing here is asserted in advance. Each claim is a paired difference from ``budgetproxy
analyze --json --compare`` (per task, bootstrap CI over tasks), printed with its interval, and
an effect is named only where the interval excludes 0, the row's p-value adjusted over its
comparison's cells (Holm, analyze's default) is below 0.05 (``significant``: the demo reads
many cells, and some intervals exclude 0 by chance alone), and the row is not ``few_tasks`` (at
least FEW_TASKS tasks, and 2K eligible episodes a task); otherwise the sentence says that this
run does not show it, and why.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from budgetproxy.analysis.stats import FEW_TASKS
from budgetproxy.demo.agents import EpisodeResult

TIGHT, LOOSE = "25%", "100%"

# The analysis splits the demo's episodes by these fields (the policy is an episode tag) and
# compares these pairs, A − B, per task.
BY = ("policy", "disclosure")
ORDERING = ("policy", "careful", "recovering")  # compared within the hidden arm
DISCLOSURE = ("disclosure", "disclosed", "hidden")  # compared per policy
COMPARE = tuple(f"{f}={a},{b}" for f, a, b in (ORDERING, DISCLOSURE))

def differences(rows: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str, str, int], Any]:
    """(compared field, other slice value, tier, K) → the ``compare`` row of analyze --json."""
    out: dict[tuple[str, str, str, int], Any] = {}
    for row in rows:
        by, tier = row.get("by") or {}, row.get("tier")
        if tier is None or len(by) != 1:
            continue
        (other,) = by.values()
        out[(str(row["field"]), str(other), str(tier), int(row["k"]))] = row
    return out


def _interval(row: Mapping[str, Any]) -> str:
    """'+0.18 [+0.03, +0.36]', or the difference and why its interval has no width."""
    if row.get("ci_note"):
        return f"{row['diff']:+.2f} ({row['ci_note']})"
    return f"{row['diff']:+.2f} [{row['ci_low']:+.2f}, {row['ci_high']:+.2f}]"


def _tasks(rows: Sequence[Mapping[str, Any]]) -> str:
    counts = sorted({int(r["n_tasks"]) for r in rows})
    text = str(counts[0]) if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
    few = ""
    if counts[0] < FEW_TASKS:
        few = f"; fewer than {FEW_TASKS}, so the intervals rest on few draws"
    return f"paired over {text} tasks{few}"


def _few(row: Mapping[str, Any]) -> bool:
    """The row's few_tasks flag (analyze's rule), or fewer than FEW_TASKS tasks without it."""
    return bool(row.get("few_tasks", int(row["n_tasks"]) < FEW_TASKS))


def _too_few(rows: Sequence[Mapping[str, Any]]) -> str:
    """Why rows flagged few_tasks name no effect, in words."""
    if min(int(r["n_tasks"]) for r in rows) < FEW_TASKS:
        return f"fewer than {FEW_TASKS} tasks"
    return "fewer than 2K episodes per task"


def _sign(row: Mapping[str, Any]) -> int:
    """+1 / -1 when the interval lies above / below 0, holds once adjusted for the comparison's
    other cells (`significant`; a row without the field: its interval alone), and rests on
    enough draws (not few_tasks), else 0: an interval over two or three tasks excludes 0 too
    easily to name an effect by."""
    if not row.get("excludes_zero") or not row.get("significant", True) or _few(row):
        return 0
    return 1 if row["diff"] > 0 else -1


def _unsupported(row: Mapping[str, Any]) -> str:
    """Why a row with enough draws names no effect, in words."""
    if row.get("ci_note"):  # (a zero-width interval, anywhere: no evidence of anything)
        return f"its interval has no spread to read ({row['ci_note']})"
    if row.get("excludes_zero"):
        p = row.get("p_adjusted")
        shown = "" if p is None else f" ({p:.2f})"
        return (f"its interval excludes 0 but its p-value adjusted over the comparison's cells"
                f"{shown} is not below 0.05")
    return "its interval includes 0"


def ordering_flip(
    diffs: Mapping[tuple[str, str, str, int], Any], ks: Sequence[int]
) -> tuple[list[str], bool | None]:
    """Careful − recovering in the hidden arm at the tight and the loose tier: lines, and
    whether the order flips with both intervals excluding 0 (None when a cell is missing)."""
    field, a, b = ORDERING
    tight, loose = diffs.get((field, "hidden", TIGHT, 1)), diffs.get((field, "hidden", LOOSE, 1))
    if tight is None or loose is None or tight["diff"] is None or loose["diff"] is None:
        return [f"{a} vs {b}: not enough episodes for Pass@1 at {TIGHT} and {LOOSE}"], None
    flipped = _sign(tight) * _sign(loose) == -1
    lines = [
        f"Pass@1, hidden arm, {a} − {b} ({_tasks([tight, loose])}): at {TIGHT} "
        f"{_interval(tight)}, at {LOOSE} {_interval(loose)}."
    ]
    if flipped:
        first, second = (a, b) if tight["diff"] > 0 else (b, a)
        lines.append(
            f"  Both intervals exclude 0 with opposite signs: {first} is ahead under the tight "
            f"budget and {second} under the loose one. The order flips."
        )
    elif _few(tight) or _few(loose):
        lines.append(f"  No flip this run can support: {_too_few([tight, loose])}.")
    else:
        weak = [(t, r) for t, r in ((TIGHT, tight), (LOOSE, loose)) if not _sign(r)]
        lines.append(
            "  No flip this run can support: "
            + ("; ".join(f"at {t} {_unsupported(r)}" for t, r in weak) + "." if weak
               else "both intervals lie on the same side of 0.")  # fmt: skip
        )
    at_k = []
    for k in ks:
        t, lo = diffs.get((field, "hidden", TIGHT, k)), diffs.get((field, "hidden", LOOSE, k))
        if k == 1 or t is None or lo is None or t["diff"] is None or lo["diff"] is None:
            continue
        verdict = "flips" if _sign(t) * _sign(lo) == -1 else "no supported flip"
        at_k.append(f"K={k}: {_interval(t)} at {TIGHT}, {_interval(lo)} at {LOOSE}, {verdict}")
    if at_k:
        lines.append("  At larger K: " + "; ".join(at_k) + ".")
    return lines, flipped


def _tiers(
    diffs: Mapping[tuple[str, str, str, int], Any], policy: str, tiers: Sequence[str]
) -> list[tuple[str, Mapping[str, Any]]]:
    """(tier, disclosed − hidden row at K=1) for one policy, where the row has a difference."""
    rows = [(t, diffs.get((DISCLOSURE[0], policy, t, 1))) for t in tiers]
    return [(t, r) for t, r in rows if r is not None and r["diff"] is not None]


def _rows(
    diffs: Mapping[tuple[str, str, str, int], Any], policy: str, tiers: Sequence[str]
) -> list[Mapping[str, Any]]:
    return [r for _, r in _tiers(diffs, policy, tiers)]


def disclosure_effect(
    diffs: Mapping[tuple[str, str, str, int], Any], policy: str, tiers: Sequence[str]
) -> tuple[list[str], list[str]]:
    """Disclosed − hidden for one policy per tier: lines, and the tiers where the interval
    excludes 0."""
    field, a, b = DISCLOSURE
    rows = [(t, diffs.get((field, policy, t, 1))) for t in tiers]
    found = [(t, r) for t, r in rows if r is not None and r["diff"] is not None]
    if not found:
        return [f"{policy}: not enough episodes to compare the arms"], []
    parts = [f"{t}: {_interval(r)}{' *' if _sign(r) else ''}" for t, r in found]
    shown = [t for t, r in found if _sign(r)]
    lines = [f"Pass@1, {policy}, {a} − {b} ({_tasks([r for _, r in found])}): "
             + "; ".join(parts) + "."]  # fmt: skip
    return lines, shown


RUNS = (("tiers", "the tier runs"), ("budgetmix", "the BudgetMix groups"),
        ("tokens", "the token arm"))


def refusals(results: Sequence[EpisodeResult]) -> dict[str, int]:
    """Calls refused for a spent budget, per run. An agent stops at its first refusal, so each
    is one episode that ran out."""
    return {run: sum(r.exhausted for r in results if r.plan.run == run) for run, _ in RUNS}


def refusal_breakdown(results: Sequence[EpisodeResult]) -> str:
    """'542 calls (412 in the tier runs, 14 in ..., 116 in ...)': where the refusals were."""
    counts = refusals(results)
    parts = [f"{counts[run]:,} in {words}" for run, words in RUNS if counts[run]]
    return f"{sum(counts.values()):,} calls" + (f" ({', '.join(parts)})" if parts else "")


def enforcement(results: Sequence[EpisodeResult]) -> list[str]:
    """How often the proxy refused a turn: per policy and arm of the tier runs (the episodes
    the table and the claims above count), then every refusal of the run."""
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
        f"The proxy refused {total} episodes of the tier runs a turn past their budget (403 "
        f"turn_budget_exhausted): " + ", ".join(parts) + ".",
        f"  Over the whole run it refused {refusal_breakdown(results)} for a spent budget (turns, "
        "or tokens in the token arm): one call per episode that ran out, since an agent stops "
        "at its first refusal. The tier runs' count above leaves out the BudgetMix groups and "
        "the token arm.",
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


def _disclosure_verdict(found: Sequence[tuple[str, Mapping[str, Any]]],
                        shown: Sequence[str], tiers: Sequence[str]) -> str:
    """The sentence under the disclosure claim: the tiers where it holds, or why none does
    (each tier's own reason when they differ)."""
    rows = [r for _, r in found]
    if shown:
        others = [t for t in tiers if t not in shown]
        return (f"  The interval excludes 0 at {', '.join(shown)}: the policy paces itself by "
                "the budget line the proxy appends, so telling it its budget changes what it "
                "does" + (f"; at {', '.join(others)} this run cannot tell the arms apart."
                          if others else "."))
    if all(_few(r) for r in rows):
        return f"  {_too_few(rows).capitalize()}: too few to name an effect of disclosure."
    if not any(r.get("excludes_zero") or _few(r) for r in rows):
        return "  No interval excludes 0: this run does not show an effect of disclosure."
    return "  This run does not show an effect of disclosure: " + "; ".join(
        f"at {t} {_too_few([r]) if _few(r) else _unsupported(r)}" for t, r in found) + "."


def what_this_shows(
    compare: Iterable[Mapping[str, Any]], results: Sequence[EpisodeResult], ks: Sequence[int] = (1,)
) -> list[str]:
    """The whole summary, as lines of text, from the ``compare`` rows of analyze --json."""
    diffs = differences(compare)
    tiers = sorted({t for _, _, t, _ in diffs}, key=lambda t: float(t.rstrip("%")))
    lines = [
        "What this shows (numbers from this run; differences of Pass@1 per task, with 95% "
        "paired bootstrap intervals over tasks; * marks an interval that excludes 0 on at least "
        f"{FEW_TASKS} tasks with 2K episodes each on average, whose p-value adjusted over its "
        "comparison's cells (Holm) is below 0.05):"
    ]
    flip_lines, _ = ordering_flip(diffs, ks)
    lines += ["- Budget-dependent ordering. " + flip_lines[0], *flip_lines[1:]]
    disc_lines, shown = disclosure_effect(diffs, "budget-aware", tiers)
    lines += ["- Disclosure changes behaviour. " + disc_lines[0]]
    if disc_lines and "not enough" not in disc_lines[0]:
        lines.append(_disclosure_verdict(_tiers(diffs, "budget-aware", tiers), shown, tiers))
    for control in ("careful", "recovering"):
        control_lines, _ = disclosure_effect(diffs, control, tiers)
        if "not enough" not in control_lines[0]:
            lines.append("  Control (ignores the budget line): " + control_lines[0])
    enforced = enforcement(results)
    lines += ["- Enforcement. " + enforced[0], *enforced[1:]]
    lines += budgetmix_groups(results)
    return lines


def token_claim(
    compare: Iterable[Mapping[str, Any]], results: Sequence[EpisodeResult]
) -> list[str]:
    """The token arm: disclosed − hidden Pass@1 under a token budget (analyze --compare on its
    logs), and what the episodes spent, per arm."""
    row = differences(compare).get((DISCLOSURE[0], "budget-aware", LOOSE, 1))
    runs = [r for r in results if r.plan.run == "tokens"]
    if row is None or row["diff"] is None or not runs:
        return ["- A token budget, disclosed: not enough episodes to compare the arms."]
    lines = [f"- A token budget, disclosed. Pass@1, budget-aware at its full turn budget and a "
             f"token budget, disclosed − hidden ({_tasks([row])}): {_interval(row)}"
             f"{' *' if _sign(row) else ''}."]
    sign = _sign(row)
    if sign:
        lines.append(
            "  The interval excludes 0: told the tokens it has left, the policy plans more moves "
            "per call, and fewer calls (each re-reading a growing conversation) fit the budget."
            if sign > 0 else
            "  The interval excludes 0, below it: telling the policy its tokens made it worse.")
    elif _few(row):
        lines.append(f"  {_too_few([row]).capitalize()}: too few to name an effect.")
    else:
        lines.append(f"  {_unsupported(row).capitalize()}: this run does not show an effect of "
                     "disclosing the token budget.")
    parts = []
    for arm in ("hidden", "disclosed"):
        mine = [r for r in runs if r.plan.disclosure == arm]
        if mine:
            parts.append(
                f"{arm}: {sum(r.won for r in mine)}/{len(mine)} won, "
                f"{sum(r.exhausted for r in mine)} refused for spent tokens, "
                f"{sum(r.turns for r in mine) / len(mine):.1f} calls and "
                f"{sum(r.tokens for r in mine) / len(mine):,.0f} tokens per episode")
    lines.append("  " + "; ".join(parts) + ".")
    return lines
