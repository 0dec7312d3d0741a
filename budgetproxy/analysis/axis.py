"""`analyze --axis`: Pass@(K,B) along turns, tokens, cost or seconds from trajectory logs.

Reads JSONL logs (plain or gzipped) itself: each episode's budgets from its episode record,
and its spend at the success turn from that turn's record (`cumulative`), or, for records
written without it (turn-only episodes), summed from the turn records: tokens from their
usage (cached input included), cost from the price table, seconds from their timestamps.
The eligibility rule is `axis_rule`'s.
"""

from __future__ import annotations

import gzip
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson

from budgetproxy.analysis.axis_rule import AXES, AxisEpisode, eligible, holds_of, succeeded_within
from budgetproxy.analysis.passk import pass_at_k
from budgetproxy.analysis.stats import bootstrap_ci
from budgetproxy.core.prices import PriceTable
from budgetproxy.core.usage import billed_tokens

BUDGET_FIELDS = {"turns": "budget", "tokens": "token_budget", "cost": "cost_budget",
                 "seconds": "time_budget_s"}
ANNOUNCED_FIELDS = {"turns": "announced_budget", "tokens": "announced_tokens",
                    "cost": "announced_cost", "seconds": "announced_time_s"}


@dataclass(frozen=True)
class AxisCell:
    k: int
    axis: str
    budget: float
    hold: dict[str, float | None]
    value: float | None
    ci_low: float | None
    ci_high: float | None
    n_tasks: int
    n_tasks_left_out: int
    n_episodes: int
    by: tuple[tuple[str, str | None], ...] = ()

    def as_json(self) -> dict[str, Any]:
        row: dict[str, Any] = {"k": self.k, "axis": self.axis, "budget": self.budget}
        if self.axis == "turns":
            row["turns"] = int(self.budget)
        row.update(value=self.value, ci_low=self.ci_low, ci_high=self.ci_high,
                   n_tasks=self.n_tasks, n_tasks_left_out=self.n_tasks_left_out,
                   n_episodes=self.n_episodes, by=dict(self.by), hold=self.hold)
        return row


def _records(files: Sequence[str]) -> Iterator[dict[str, Any]]:
    for name in files:
        opener = gzip.open if name.endswith(".gz") else open
        with opener(name, "rb") as f:
            for line in f:
                try:
                    rec = orjson.loads(line)
                except orjson.JSONDecodeError:
                    continue
                if isinstance(rec, dict):
                    yield rec


def _epoch(ts: Any) -> float | None:
    if not isinstance(ts, str):
        return None
    try:
        return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _spend(turns: list[dict[str, Any]], success_turn: int, prices: PriceTable,
           model: str | None) -> dict[str, float | None]:
    """Cumulative spend per axis at the end of `success_turn` (its last record)."""
    upto = [r for r in turns if isinstance(r.get("turn"), int) and r["turn"] <= success_turn
            and r.get("status") != "rejected"]
    at = [r for r in upto if r["turn"] == success_turn]
    out: dict[str, float | None] = {"turns": float(success_turn), "tokens": None,
                                    "cost": None, "seconds": None}
    cum = at[-1].get("cumulative") if at else None
    if isinstance(cum, dict):
        for axis in ("tokens", "cost", "seconds"):
            if isinstance(cum.get(axis), int | float):
                out[axis] = float(cum[axis])
    counts = [billed_tokens(r.get("usage")) for r in upto]
    if out["tokens"] is None and upto and all(c is not None for c in counts):
        out["tokens"] = float(sum(c[0] + c[1] for c in counts if c is not None))
    if out["cost"] is None and upto and model is not None:
        costs = [prices.cost(r.get("model") or model, r.get("usage")) for r in upto]
        if all(c is not None for c in costs):
            out["cost"] = float(sum(c for c in costs if c is not None))
    if out["seconds"] is None and at:
        first, end = upto[0], at[-1]
        t0, t1 = _epoch(first.get("ts")), _epoch(end.get("ts"))
        lat = first.get("latency_s")
        if t0 is not None and t1 is not None and isinstance(lat, int | float):
            out["seconds"] = max(0.0, t1 - (t0 - float(lat)))
    return out


def _by_value(ep: dict[str, Any], name: str) -> str | None:
    """A --by field of an episode record, or else of its tags, as text."""
    value = ep.get(name)
    if value is None and isinstance(ep.get("tags"), dict):
        value = ep["tags"].get(name)
    return None if value is None else str(value)


def load(files: Sequence[str], prices: PriceTable, by: Sequence[str] = ()
         ) -> tuple[list[AxisEpisode], int]:
    """Episodes that count at all (finished with a task, not abandoned), and how many were
    left out for that."""
    episodes: dict[str, dict[str, Any]] = {}
    turns: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for rec in _records(files):
        eid = rec.get("episode_id")
        if not isinstance(eid, str):
            continue
        if rec.get("type") == "episode":
            episodes[eid] = rec
        elif rec.get("type") == "turn":
            turns[eid].append(rec)
    out: list[AxisEpisode] = []
    left_out = 0
    for eid, ep in episodes.items():
        if not ep.get("task_id") or ep.get("end_reason") == "abandoned":
            left_out += 1
            continue
        success = ep.get("outcome") == "success"
        st = ep.get("success_turn")
        spend = _spend(turns.get(eid, []), st, prices, ep.get("model")) if (
            success and isinstance(st, int)) else {}
        out.append(AxisEpisode(
            task_id=str(ep["task_id"]), disclosure=str(ep.get("disclosure") or "hidden"),
            budgets={a: _num(ep.get(f)) for a, f in BUDGET_FIELDS.items()},
            success=success, spend_at_success=spend,
            announced={a: _num(ep.get(f)) for a, f in ANNOUNCED_FIELDS.items()},
            by=tuple((name, _by_value(ep, name)) for name in by)))
    return out, left_out


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def compute(episodes: list[AxisEpisode], axis: str, budgets: Sequence[float],
            ks: Sequence[int], fixed: Mapping[str, float | None], resamples: int = 1000,
            seed: int = 0) -> list[AxisCell]:
    """Every (hold, B, K) cell: per task n eligible and c succeeded within, Pass@K averaged
    over the tasks with n >= K, with bootstrap CIs over tasks."""
    slices: dict[tuple[tuple[str, str | None], ...], list[AxisEpisode]] = defaultdict(list)
    for ep in episodes:
        slices[ep.by].append(ep)
    cells = []
    for key in sorted(slices, key=lambda k: [(v is None, v or "") for _, v in k]):
        cells += _slice_cells(slices[key], key, axis, budgets, ks, fixed, resamples, seed)
    return cells


def _slice_cells(episodes: list[AxisEpisode], key: tuple[tuple[str, str | None], ...],
                 axis: str, budgets: Sequence[float], ks: Sequence[int],
                 fixed: Mapping[str, float | None], resamples: int, seed: int
                 ) -> list[AxisCell]:
    by_task: dict[str, list[AxisEpisode]] = defaultdict(list)
    for ep in episodes:
        by_task[ep.task_id].append(ep)
    cells = []
    for hold in holds_of(episodes, axis, fixed):
        for b in budgets:
            counts = []
            for eps in by_task.values():
                ok = [e for e in eps if eligible(e, axis, b, hold)]
                if ok:
                    counts.append((len(ok), sum(succeeded_within(e, axis, b, hold)
                                                for e in ok)))
            for k in ks:
                vals = [pass_at_k(n, c, k) for n, c in counts if n >= k]
                low = high = None
                if vals:
                    low, high = bootstrap_ci(vals, resamples, seed)
                cells.append(AxisCell(
                    k, axis, b, dict(hold), sum(vals) / len(vals) if vals else None, low, high,
                    len(vals), len(counts) - len(vals),
                    sum(n for n, _ in counts if n >= k), key))
    return cells


def format_cells(cells: Sequence[AxisCell]) -> str:
    lines = []
    for by, hold in {(c.by, tuple(sorted(c.hold.items()))): None for c in cells}:
        shown = ", ".join(f"{a}={'-' if v is None else f'{v:g}'}" for a, v in hold)
        mine = [c for c in cells if c.by == by and tuple(sorted(c.hold.items())) == hold]
        axis = mine[0].axis
        where = "".join(f", {f}={v}" for f, v in by)
        lines.append(f"Pass@(K,B) along {axis}, other budgets at {shown}{where}")
        budgets = list(dict.fromkeys(c.budget for c in mine))
        ks = list(dict.fromkeys(c.k for c in mine))
        lines.append("K \\ B".ljust(8) + "".join(f"{b:>12g}" for b in budgets))
        for k in ks:
            row = [next(c for c in mine if c.k == k and c.budget == b) for b in budgets]
            lines.append(str(k).ljust(8) + "".join(
                f"{'-' if c.value is None else f'{c.value:.3f}':>12}" for c in row))
        lines.append("")
    return "\n".join(lines) + "\n"


def parse_hold(items: Sequence[str]) -> dict[str, float | None]:
    """`--hold turns=20,tokens=none`: the levels of the other axes (none: no cap)."""
    out: dict[str, float | None] = {}
    for item in items:
        name, _, value = item.partition("=")
        if name not in AXES or not value:
            raise ValueError(f"--hold: expected AXIS=VALUE with AXIS in {', '.join(AXES)}, "
                             f"got {item!r}")
        out[name] = None if value.lower() == "none" else float(value)
    return out
