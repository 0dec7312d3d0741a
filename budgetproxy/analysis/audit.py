"""BudgetMix audit: budgets on the candidate grid, one budget per group, uniform draws."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from budgetproxy.analysis.db import sql_str
from budgetproxy.analysis.passk import budgetmix_candidates
from budgetproxy.analysis.stats import chi_square, chi_square_sf

MIN_EXPECTED = 5  # the chi-square approximation needs about 5 expected draws per category
EXAMPLES = 5

# One row per draw, in a fixed order: a (task_id, group), or an episode of no group. Groups
# that disagree on their budget or arm report every value they hold. `audited` is the filter
# on the episodes.
DRAWS_SQL = """
SELECT task_id, "group", max(max_turns) AS max_turns,
    list(DISTINCT budget ORDER BY budget) AS budgets,
    list(DISTINCT disclosure ORDER BY disclosure) AS arms,
    count(*) AS episodes, count(DISTINCT max_turns) AS max_turns_values
FROM episodes WHERE task_id IS NOT NULL AND {audited}
GROUP BY task_id, "group", CASE WHEN "group" IS NULL THEN episode_id END
ORDER BY task_id, "group" NULLS LAST, min(episode_id)
"""


@dataclass
class AuditResult:
    """What the audit found; `problems` empty means the log looks like BudgetMix."""

    step: Fraction
    draws: int = 0
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    chi2: float | None = None
    dof: int | None = None
    p_value: float | None = None
    # per max_turns tested: [(budget, observed draws, expected draws)]
    uniformity: dict[int, list[tuple[int, int, float]]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "step": float(self.step),
            "draws": self.draws,
            "problems": self.problems,
            "notes": self.notes,
            "chi2": self.chi2,
            "dof": self.dof,
            "p_value": self.p_value,
            "uniformity": {
                str(m): [{"budget": b, "observed": o, "expected": e} for b, o, e in rows]
                for m, rows in self.uniformity.items()
            },
        }


def audit_budgetmix(
    con: Any, step: Fraction, alpha: float = 0.01, groups: str | None = None
) -> AuditResult:
    """Check the `episodes` table against BudgetMix with this step. `groups`: an RE2 regex;
    only episodes whose group it matches (searched, not anchored) are audited, so episodes run
    at fixed budgets in the same log do not count as draws."""
    result = AuditResult(step=step)
    audited = (
        "true" if groups is None else f'coalesce(regexp_matches("group", {sql_str(groups)}), false)'
    )
    rows = con.execute(DRAWS_SQL.format(audited=audited)).fetchall()
    no_task, ungrouped, skipped = con.execute(
        f"""SELECT count(*) FILTER (WHERE task_id IS NULL),
            count(*) FILTER (WHERE task_id IS NOT NULL AND "group" IS NULL AND {audited}),
            count(*) FILTER (WHERE task_id IS NOT NULL AND NOT ({audited}))
        FROM episodes"""
    ).fetchone()
    if no_task:
        result.notes.append(f"{no_task:,} episodes without task_id are not audited")
    if groups is not None:
        result.notes.append(
            f"only episodes whose group matches /{groups}/ are audited; {skipped:,} others are not"
        )
    result.draws = len(rows)
    if not rows:
        matching = "with a task_id" + (
            "" if groups is None else f" and a group matching /{groups}/"
        )
        result.problems.append(f"nothing to audit: no episode {matching}")
    off_grid: list[str] = []
    off_grid_episodes = 0
    no_max: list[str] = []
    split_budget: list[str] = []
    split_arm: list[str] = []
    observed: dict[int, Counter[int]] = defaultdict(Counter)
    for task, group, max_turns, budgets, arms, episodes, max_turns_values in rows:
        name = f"task {task} group {group}" if group is not None else f"task {task}"
        if len(budgets) > 1:
            split_budget.append(f"{name}: budgets {', '.join(map(str, budgets))}")
        if len(arms) > 1:
            split_arm.append(f"{name}: arms {', '.join(arms)}")
        if max_turns is None or max_turns_values > 1:
            no_max.append(name)
            continue
        grid = budgetmix_candidates(int(max_turns), step)
        bad = [b for b in budgets if b not in grid]
        if bad:
            off_grid_episodes += episodes
            off_grid.append(
                f"{name}: budget {', '.join(map(str, bad))} with max_turns {max_turns} "
                f"(grid {', '.join(map(str, sorted(set(grid))))})"
            )
        elif len(budgets) == 1:
            observed[int(max_turns)][int(budgets[0])] += 1
    _problem(
        result,
        off_grid,
        f"{len(off_grid):,} draws ({off_grid_episodes:,} episodes) "
        f"have budgets off the candidate grid",
    )
    _problem(result, split_budget, f"{len(split_budget):,} groups hold more than one budget")
    _problem(result, split_arm, f"{len(split_arm):,} groups mix hidden and disclosed arms")
    _problem(
        result, no_max, f"{len(no_max):,} draws have no single max_turns, so their grid is unknown"
    )
    _uniformity(result, observed, step, alpha)
    if result.problems and ungrouped and ungrouped < sum(r[5] for r in rows):
        result.notes.append(
            f"{ungrouped:,} episodes without a group count as one draw each; if they ran at "
            f"fixed budgets, audit only the BudgetMix groups (--audit-groups REGEX)"
        )
    return result


def _problem(result: AuditResult, examples: list[str], headline: str) -> None:
    if examples:
        examples = list(dict.fromkeys(examples))
        shown = "; ".join(examples[:EXAMPLES]) + ("; …" if len(examples) > EXAMPLES else "")
        result.problems.append(f"{headline}, e.g. {shown}")


def _uniformity(
    result: AuditResult, observed: dict[int, Counter[int]], step: Fraction, alpha: float
) -> None:
    """Pearson's test per max_turns, summed: the draw is uniform over candidate indices, so a
    budget that several indices round to is proportionally more likely."""
    stat = 0.0
    dof = 0
    too_few = []
    for max_turns in sorted(observed):
        grid = budgetmix_candidates(max_turns, step)
        weight = Counter(grid)
        draws = sum(observed[max_turns].values())
        rows = [
            (b, observed[max_turns][b], draws * w / len(grid)) for b, w in sorted(weight.items())
        ]
        if len(rows) < 2:
            continue
        if min(e for _, _, e in rows) < MIN_EXPECTED:
            too_few.append(max_turns)
            continue
        result.uniformity[max_turns] = rows
        stat += chi_square([o for _, o, _ in rows], [e for _, _, e in rows])
        dof += len(rows) - 1
    if too_few:
        result.notes.append(
            f"uniformity not tested for max_turns {', '.join(map(str, too_few))}: fewer than "
            f"{MIN_EXPECTED} expected draws per candidate"
        )
    if dof == 0:
        return
    result.chi2, result.dof, result.p_value = stat, dof, chi_square_sf(stat, dof)
    if result.p_value < alpha:
        result.problems.append(
            f"budgets are not uniform over the candidates: chi2 = {stat:.1f}, dof = {dof}, "
            f"p = {result.p_value:.2g} < {alpha:g}"
        )


def format_audit(result: AuditResult) -> str:
    """The audit as text: verdict, problems, notes, observed vs expected draws."""
    verdict = "OK" if result.ok else f"{len(result.problems)} problem(s)"
    lines = [f"BudgetMix audit (step {float(result.step):g}, {result.draws:,} draws): {verdict}"]
    lines += [f"  ✗ {p}" for p in result.problems]
    lines += [f"  · {n}" for n in result.notes]
    if result.p_value is not None:
        lines.append(
            f"  uniformity: chi2 = {result.chi2:.1f}, dof = {result.dof}, p = {result.p_value:.3g}"
        )
    for max_turns, rows in result.uniformity.items():
        cells = ", ".join(f"{b}: {o}/{e:.1f}" for b, o, e in rows)
        lines.append(f"  max_turns {max_turns} (budget: observed/expected draws) {cells}")
    return "\n".join(lines) + "\n"
