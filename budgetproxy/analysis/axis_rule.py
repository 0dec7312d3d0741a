"""Pass@(K,B) along any budget axis: which episodes count at B, and which succeeded within it.

A cell is a point in budget space: B on the analysed axis X, and a level h_Y on every other
axis Y (None: no cap on Y). An episode counts in the cell when its own run, under the caps it
was given, shows exactly what a run capped at the cell's levels would have done:

- hidden episodes (the agent sees no budget): its budget on X is at least B (or none), and on
  every other axis its budget is at least h_Y (or none), where h_Y None requires no cap on Y.
  A cap the agent cannot see changes nothing before it binds, and a cap at or above the
  cell's level binds no sooner than the cell's would: truncating at the cell is exact.
  A cap below the cell's level on any axis could have cut the run before it reached B, so
  that episode is left out; which episodes are left out depends only on their budgets, never
  on how their runs went (leaving out the runs that happened to be cut early would bias the
  estimate towards frugal runs).
- disclosed episodes (the agent was told its budgets and may plan for them): every budget
  equals the cell's level (B on X, h_Y elsewhere) and none was announced differently.

A tier p% is a cell whose B differs per episode: p% of the episode's full budget on X (on
turns max(1, round_half_up(p/100 × max_turns)), as for turn tiers; on the other axes p/100 ×
the full budget, exactly). An episode with no full budget on X is in no tier. Who counts and
who succeeded within are then the rules above at that episode's B.

An episode whose spend on a capped axis cannot be known (a model without a price on cost,
calls without usage on tokens) counts in no cell capped on that axis: its success could not
be placed within or beyond B. Whether its spend is known depends on its records, not on its
outcome, so leaving it out favours neither.

Succeeded within the cell: the episode succeeded, and its cumulative spend at the success
turn is at most B on X and at most h_Y on every capped Y. A call clamped by a token budget
ends with the whole budget spent and its input on top, so it is never within B.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction

from budgetproxy.analysis.passk import tier_to_turns

AXES = ("turns", "tokens", "cost", "seconds")


@dataclass(frozen=True)
class AxisEpisode:
    """What the rule needs of one finished episode."""

    task_id: str
    disclosure: str  # "hidden" | "disclosed"
    budgets: Mapping[str, float | None]  # per axis; None: no cap (turns always has one)
    success: bool
    # cumulative spend per axis at the success turn (None: unknown, or no success)
    spend_at_success: Mapping[str, float | None] = field(default_factory=dict)
    announced: Mapping[str, float | None] = field(default_factory=dict)
    by: tuple[tuple[str, str | None], ...] = ()  # the --by fields' values
    # full budget per axis, the base of tiers (turns: max_turns; None: in no tier)
    full: Mapping[str, float | None] = field(default_factory=dict)
    # axes whose spend cannot be known, with the reason ("unpriced model", ...)
    unknown: Mapping[str, str] = field(default_factory=dict)
    unpriced: tuple[str, ...] = ()  # the models no price is known for


def number_label(v: float) -> str:
    """A budget as text: 2000, 0.25, 1e+07 (whole numbers without a point)."""
    return str(int(v)) if v.is_integer() and abs(v) < 1e15 else f"{v:.10g}"


@dataclass(frozen=True)
class Column:
    """One B column: an absolute budget on the axis, or a tier (percent of each episode's
    full budget on it)."""

    kind: str  # "budget" | "tier"
    value: Fraction

    @property
    def label(self) -> str:
        if self.kind == "budget":
            return number_label(float(self.value))
        text = str(self.value) if self.value.denominator == 1 else f"{float(self.value):g}"
        return f"{text}%"

    def budget_of(self, ep: AxisEpisode, axis: str) -> float | None:
        """B for `ep` in this column; None: `ep` is not in it (a tier, and no full budget)."""
        if self.kind == "budget":
            return float(self.value)
        full = ep.full.get(axis)
        if full is None:
            return None
        if axis == "turns":
            return float(tier_to_turns(self.value, int(full)))
        # as BudgetMix draws it: decimal fractions of the full budget as written, tokens whole
        b = self.value / 100 * Fraction(repr(full))
        return float(max(1, round(b))) if axis == "tokens" else float(b)


def eligible(ep: AxisEpisode, axis: str, b: float, hold: Mapping[str, float | None]) -> bool:
    """Whether `ep` counts at B = `b` on `axis` with the other axes at `hold`."""
    levels = {**{y: hold.get(y) for y in AXES if y != axis}, axis: b}
    for y, level in levels.items():
        if level is not None and y in ep.unknown:
            return False
        own = ep.budgets.get(y)
        if ep.disclosure == "hidden":
            if own is not None and (level is None or own < level):
                return False
        else:
            announced = ep.announced.get(y)
            if own != level or (announced is not None and announced != level):
                return False
    return True


def succeeded_within(ep: AxisEpisode, axis: str, b: float,
                     hold: Mapping[str, float | None]) -> bool:
    if not ep.success:
        return False
    levels = {**{y: hold.get(y) for y in AXES if y != axis}, axis: b}
    for y, level in levels.items():
        if level is None:
            continue
        spent = ep.spend_at_success.get(y)
        if spent is None or spent > level + _slack(y):
            return False
    return True


def _slack(axis: str) -> float:
    """Costs and seconds are floats summed in a different order than the budget was set in."""
    return 1e-9 if axis in ("cost", "seconds") else 0.0


def holds_of(episodes: list[AxisEpisode], axis: str,
             fixed: Mapping[str, float | None]) -> list[dict[str, float | None]]:
    """The levels of the other axes to report at: those fixed by the caller, and on each
    other axis every budget level the episodes were run at (the caps as enforced)."""
    others = [y for y in AXES if y != axis]
    seen: dict[tuple[float | None, ...], dict[str, float | None]] = {}
    for ep in episodes:
        hold = {y: fixed[y] if y in fixed else ep.budgets.get(y) for y in others}
        seen.setdefault(tuple(hold[y] for y in others), hold)
    return [seen[k] for k in sorted(seen, key=lambda k: [(v is None, v or 0) for v in k])]
