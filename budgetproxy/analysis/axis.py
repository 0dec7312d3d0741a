"""`analyze --axis`: the episodes of trajectory logs as the rule along any axis needs them.

Reads JSONL logs (plain or gzipped) itself: each episode's budgets from its episode record,
and its spend at the success turn from that turn's record (`cumulative`), or, for records
written without it (turn-only episodes), summed from the turn records: tokens from their
usage (cached input included), cost from the price table, seconds from their timestamps.
The eligibility rule is `axis_rule`'s; the cells are `axis_table`'s.

The full budget of an episode on an axis (the base of its tiers) is `max_turns` on turns, and
on the other axes the BudgetMix full budget its record names (`full_token_budget`,
`full_cost_budget`, `full_time_budget_s`: `budget.budgetmix.max_*` of the proxy that ran it),
else the episode's own budget on that axis (a tier then truncates an episode run at its full
budget).
"""

from __future__ import annotations

import gzip
from collections import defaultdict
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any

import orjson

from budgetproxy.analysis.axis_rule import AXES, AxisEpisode
from budgetproxy.core.prices import PriceTable
from budgetproxy.core.usage import billed_tokens

BUDGET_FIELDS = {"turns": "budget", "tokens": "token_budget", "cost": "cost_budget",
                 "seconds": "time_budget_s"}
ANNOUNCED_FIELDS = {"turns": "announced_budget", "tokens": "announced_tokens",
                    "cost": "announced_cost", "seconds": "announced_time_s"}


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
            by=tuple((name, _by_value(ep, name)) for name in by),
            full={a: _full(ep, a) for a in BUDGET_FIELDS}))
    return out, left_out


FULL_FIELDS = {"turns": "max_turns", "tokens": "full_token_budget",
               "cost": "full_cost_budget", "seconds": "full_time_budget_s"}


def _full(ep: dict[str, Any], axis: str) -> float | None:
    """The base of an episode's tiers on `axis` (module docstring)."""
    full = _num(ep.get(FULL_FIELDS[axis]))
    if full is None and axis != "turns":
        full = _num(ep.get(BUDGET_FIELDS[axis]))
    return full


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def parse_hold(items: Sequence[str]) -> dict[str, float | None]:
    """`--hold turns=20,tokens=none`: the levels of the other axes (none: no cap)."""
    out: dict[str, float | None] = {}
    for item in items:
        name, _, value = item.partition("=")
        what = (f"--hold: expected AXIS=VALUE with AXIS in {', '.join(AXES)} and VALUE a "
                f"positive number or none, got {item!r}")
        if name not in AXES or not value:
            raise ValueError(what)
        if value.lower() == "none":
            out[name] = None
            continue
        try:
            level = float(value)
        except ValueError:
            raise ValueError(what) from None
        if not 0 < level < float("inf"):
            raise ValueError(what)
        out[name] = level
    return out
