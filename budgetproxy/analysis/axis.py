"""`analyze --axis`: the episodes of trajectory logs as the rule along any axis needs them.

Reads JSONL logs (plain or gzipped) with the reader of the default path (`load`): the same
episode validation, the last record of an episode winning, bad lines skipped and counted,
unreadable files (a truncated .gz) skipped and named. Each episode's budgets come from its
episode record,
and its spend at the success turn (`success_turn`, else `turns_used`, as the turn table reads
it) from that turn's last answered attempt (`cumulative`), whatever order the files and lines
came in; or, for records written without it (turn-only episodes), summed from the turn
records: tokens from their usage (cached input included), cost from the price table, seconds
from their timestamps. An episode whose spend on an axis cannot be known (a model without a
price, calls without usage) says so per axis, from its records alone (`unknown_spend`).
The eligibility rule is `axis_rule`'s; the cells are `axis_table`'s.

The full budget of an episode on an axis (the base of its tiers) is `max_turns` on turns, and
on the other axes the BudgetMix full budget its record names (`full_token_budget`,
`full_cost_budget`, `full_time_budget_s`: `budget.budgetmix.max_*` of the proxy that ran it),
else the episode's own budget on that axis (a tier then truncates an episode run at its full
budget).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import orjson

from budgetproxy.analysis import load as logs
from budgetproxy.analysis.axis_rule import AXES, AxisEpisode
from budgetproxy.analysis.progress import Progress
from budgetproxy.analysis.table import by_expression
from budgetproxy.core.prices import PriceTable
from budgetproxy.core.usage import billed_tokens

BUDGET_FIELDS = {"turns": "budget", "tokens": "token_budget", "cost": "cost_budget",
                 "seconds": "time_budget_s"}
ANNOUNCED_FIELDS = {"turns": "announced_budget", "tokens": "announced_tokens",
                    "cost": "announced_cost", "seconds": "announced_time_s"}


def _epoch(ts: Any) -> float | None:
    if not isinstance(ts, str):
        return None
    try:
        return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _answered(turns: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records that spent something (refused calls did not), one per (turn, attempt), in
    that order: the file and line order they were read in must not change the spend."""
    kept: dict[tuple[int, int], dict[str, Any]] = {}
    for r in turns:
        turn, attempt = r.get("turn"), r.get("attempt")
        if not isinstance(turn, int) or r.get("status") == "rejected":
            continue
        key = (turn, attempt if isinstance(attempt, int) else 1)
        # a record held twice (a log given twice, a copied file) counts once; an answer over
        # a failure of the same attempt
        if key not in kept or (r.get("status") == "ok" and kept[key].get("status") != "ok"):
            kept[key] = r
    return [kept[k] for k in sorted(kept)]


def _spend(turns: list[dict[str, Any]], success_turn: int, prices: PriceTable,
           model: str | None) -> dict[str, float | None]:
    """Cumulative spend per axis at the end of `success_turn`: its last answered attempt."""
    upto = [r for r in _answered(turns) if r["turn"] <= success_turn]
    at = [r for r in upto if r["turn"] == success_turn]
    answered = [r for r in at if r.get("status") == "ok"] or at
    end = answered[-1] if answered else None
    out: dict[str, float | None] = {"turns": float(success_turn), "tokens": None,
                                    "cost": None, "seconds": None}
    cum = end.get("cumulative") if end is not None else None
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
    if out["seconds"] is None and end is not None:
        first = upto[0]
        t0, t1 = _epoch(first.get("ts")), _epoch(end.get("ts"))
        lat = first.get("latency_s")
        if t0 is not None and t1 is not None and isinstance(lat, int | float):
            out["seconds"] = max(0.0, t1 - (t0 - float(lat)))
    return out


def _tracked(records: list[dict[str, Any]], axis: str) -> bool:
    """Whether every record holds the proxy's own cumulative spend on `axis`."""
    return all(isinstance((r.get("cumulative") or {}).get(axis), int | float)
               for r in records)


def unknown_spend(turns: list[dict[str, Any]], turns_used: int, prices: PriceTable,
                  model: str | None) -> tuple[dict[str, str], tuple[str, ...]]:
    """Per axis, why an episode's spend on it cannot be known (axes absent: known), and the
    models no price is known for. Decided from all its records, never from its outcome, so
    leaving these episodes out cannot favour successes or failures."""
    records = _answered(turns)
    if not records:
        if turns_used == 0:
            return {}, ()
        return dict.fromkeys(("tokens", "cost", "seconds"), "no turn records"), ()
    if max(r["turn"] for r in records) < turns_used:
        # its last turns' records are not among the files (a rotated file left out): sums
        # over the others would understate its spend
        return dict.fromkeys(("tokens", "cost", "seconds"), "turn records missing"), ()
    out: dict[str, str] = {}
    usage_known = all(billed_tokens(r.get("usage")) is not None for r in records)
    if not _tracked(records, "tokens") and not usage_known:
        out["tokens"] = "usage not reported"
    unpriced: tuple[str, ...] = ()
    if not _tracked(records, "cost"):
        names = sorted({str(r.get("model") or model) for r in records})
        unpriced = tuple(n for n in names if prices.rates(n) is None)
        if unpriced:
            out["cost"] = "unpriced model"
        elif not usage_known:
            out["cost"] = "usage not reported"
    if not _tracked(records, "seconds") and not (
            isinstance(records[0].get("latency_s"), int | float)
            and all(_epoch(r.get("ts")) is not None for r in records)):
        out["seconds"] = "no timestamps"
    return out, unpriced


# The turn record fields the spend is read from (JSON: parsed here).
TURN_FIELDS = {"episode_id": "VARCHAR", "turn": "BIGINT", "attempt": "BIGINT",
               "status": "VARCHAR", "model": "VARCHAR", "ts": "VARCHAR", "latency_s": "DOUBLE",
               "usage": "JSON", "cumulative": "JSON"}


def load_logs(files: Sequence[str], prices: PriceTable, by: Sequence[str] = ()
              ) -> tuple[list[AxisEpisode], int, logs.ScanSummary]:
    """Episodes that count at all (finished with a task, not abandoned), how many were left
    out for that, and the reader's summary (skipped lines by reason, unreadable files), read
    as the default path reads them."""
    inputs = logs.discover(list(files))
    with logs.connect() as con:
        summary = logs.load_episodes(con, inputs, Progress(inputs.total_bytes))
        names = ["episode_id", "task_id", "end_reason", "success", "turns_used",
                 "success_turn", "model", "disclosure",
                 *BUDGET_FIELDS.values(), *ANNOUNCED_FIELDS.values(), *FULL_FIELDS.values()]
        names = list(dict.fromkeys(names))
        cols = ", ".join([*(f'"{n}"' for n in names), *(by_expression(f) for f in by)])
        rows = con.execute(f"SELECT {cols} FROM episodes ORDER BY episode_id").fetchall()
        turns: dict[str, list[dict[str, Any]]] = defaultdict(list)
        if summary.episodes:
            logs.create_turns_view(con, summary.readable, "axis_turns", TURN_FIELDS)
            found = con.execute(
                "SELECT * FROM axis_turns WHERE episode_id IN (SELECT episode_id FROM episodes)"
            ).fetchall()
            for row in found:
                rec = dict(zip(TURN_FIELDS, row, strict=True))
                for name in ("usage", "cumulative"):
                    rec[name] = orjson.loads(rec[name]) if rec[name] is not None else None
                turns[rec["episode_id"]].append(rec)
    out: list[AxisEpisode] = []
    left_out = 0
    for row in rows:
        ep = dict(zip(names, row[:len(names)], strict=True))
        eid = ep["episode_id"]
        if not ep.get("task_id") or ep.get("end_reason") == "abandoned":
            left_out += 1
            continue
        success = bool(ep["success"])
        used = int(ep["turns_used"])
        # as the turn table reads it: a success reported without a turn was at turns_used
        st = ep["success_turn"] if ep["success_turn"] is not None else used
        spend = _spend(turns.get(eid, []), st, prices, ep.get("model")) if success else {}
        unknown, unpriced = unknown_spend(turns.get(eid, []), used, prices, ep.get("model"))
        out.append(AxisEpisode(
            task_id=str(ep["task_id"]), disclosure=str(ep["disclosure"]),
            budgets={a: _num(ep.get(f)) for a, f in BUDGET_FIELDS.items()},
            success=success, spend_at_success=spend,
            announced={a: _num(ep.get(f)) for a, f in ANNOUNCED_FIELDS.items()},
            by=tuple((name, None if value is None else str(value))
                     for name, value in zip(by, row[len(names):], strict=True)),
            full={a: _full(ep, a) for a in BUDGET_FIELDS},
            unknown=unknown, unpriced=unpriced))
    return out, left_out, summary


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


def split_unknown(episodes: Sequence[AxisEpisode], axes: Sequence[str]
                  ) -> tuple[list[AxisEpisode], dict[str, list[AxisEpisode]]]:
    """The episodes whose spend on every one of `axes` is known, and the others by reason
    ("cost unknown: unpriced model"); each episode is counted under its first unknown axis."""
    known: list[AxisEpisode] = []
    unknown: dict[str, list[AxisEpisode]] = {}
    for ep in episodes:
        why = next((f"{a} unknown: {ep.unknown[a]}" for a in axes if a in ep.unknown), None)
        if why is None:
            known.append(ep)
        else:
            unknown.setdefault(why, []).append(ep)
    return known, unknown


def parse_prices(items: Sequence[str]) -> dict[str, dict[str, float]]:
    """`--price GLOB=IN,OUT` (USD per million input and output tokens) as a `prices` table."""
    out: dict[str, dict[str, float]] = {}
    for item in items:
        glob, _, rates = item.partition("=")
        parts = rates.split(",")
        what = (f"--price: expected GLOB=IN,OUT in USD per million tokens (e.g. "
                f"'my-model*=0.5,1.5'), got {item!r}")
        if not glob or len(parts) != 2:
            raise ValueError(what)
        try:
            inp, outp = (float(p) for p in parts)
        except ValueError:
            raise ValueError(what) from None
        if not (0 <= inp < float("inf") and 0 <= outp < float("inf")):
            raise ValueError(what)
        out[glob.strip()] = {"input_per_mtok": inp, "output_per_mtok": outp}
    return out


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
