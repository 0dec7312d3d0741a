"""`budgetproxy analyze --axis ...`: checks the flags, reads the logs, prints the cells."""

from __future__ import annotations

import argparse
import json
import sys
from fractions import Fraction
from typing import Any

from budgetproxy.analysis import axis, axis_table, load
from budgetproxy.analysis.axis_rule import Column
from budgetproxy.analysis.command import (
    _inputs_json,
    _print_skipped,
    duplicates_lines,
    read_line,
)
from budgetproxy.analysis.compare import adjusted
from budgetproxy.core.prices import PriceTable


def run_axis(args: argparse.Namespace) -> int:
    """`analyze --axis/--budgets/--hold`: Pass@(K,B) tables (and differences) along an axis;
    returns the exit code, raising load.InputError for bad arguments or paths."""
    name = args.axis or "turns"
    others = [flag for flag, on in (
        ("--report", args.report is not None), ("--to-parquet", args.to_parquet is not None),
        ("--error-pattern", args.error_pattern is not None),
        ("--audit-budgetmix", args.audit_budgetmix or args.audit_groups is not None),
        ("--turns (give --budgets)", bool(args.turns))) if on]
    if others:
        raise load.InputError("Pass@(K,B) along an axis (--axis, --budgets, --hold) does not "
                              f"combine with {', '.join(others)}", exit_code=2)
    if not args.budgets and args.tiers is None:
        raise load.InputError(f"--axis {name} needs --budgets B1,B2,... or --tiers P1,P2,...",
                              exit_code=2)
    try:
        fixed = axis.parse_hold(args.hold)
    except ValueError as e:
        raise load.InputError(str(e), exit_code=2) from None
    if name in fixed:
        raise load.InputError(f"--hold {name}=...: {name} is the analysed axis (--axis)",
                              exit_code=2)
    inputs = load.discover(args.paths)
    if not inputs.jsonl:
        raise load.InputError(f"no JSONL trajectory logs in {', '.join(args.paths)} "
                              "(--axis reads *.jsonl and *.jsonl.gz)")
    columns = [Column("tier", p) for p in args.tiers or []]
    columns += [Column("budget", Fraction(b)) for b in args.budgets or []]
    fields = list(dict.fromkeys([*args.by, *(c.field for c in args.compare)]))
    try:
        prices = PriceTable(axis.parse_prices(args.price))
    except ValueError as e:
        raise load.InputError(str(e), exit_code=2) from None
    loaded, left_out, summary = axis.load_logs(inputs.jsonl, prices, fields)
    _print_skipped(summary)
    if not loaded:
        raise load.InputError(f"no finished episodes with a task_id in {inputs.files} file(s)")
    capped = [name, *(y for y, level in fixed.items() if level is not None)]
    episodes, unknown = axis.split_unknown(loaded, capped)
    reasons: dict[str, int] = {}
    if left_out:
        reasons["abandoned or without task_id"] = left_out
    for reason, eps in unknown.items():
        reasons[reason] = len(eps)
        models = sorted({m for ep in eps for m in ep.unpriced})
        what = (f": no price for {', '.join(models)} (give --price GLOB=IN,OUT, USD per "
                "million tokens)" if models else "")
        print(f"budgetproxy analyze: {len(eps):,} episode(s) left out ({reason}){what}",
              file=sys.stderr)
    left_out += sum(len(eps) for eps in unknown.values())
    if not episodes:
        raise load.InputError(f"no episode's spend on {', '.join(capped)} is known")
    cells = axis_table.compute(episodes, name, columns, args.k, fixed, args.by, args.resamples,
                               args.seed)
    for field in args.by:
        if all(dict(ep.by).get(field) is None for ep in episodes):
            print(f"budgetproxy analyze: --by {field}: no episode has this field or tag",
                  file=sys.stderr)
    differences = []
    for comparison in args.compare:
        seen = {dict(ep.by).get(comparison.field) for ep in episodes}
        for value in (comparison.a, comparison.b):
            if value not in seen:
                print(f"budgetproxy analyze: --compare {comparison.field}={comparison.a},"
                      f"{comparison.b}: no episode has {comparison.field} = {value!r}",
                      file=sys.stderr)
        found = axis_table.compute_differences(
            episodes, comparison, name, columns, args.k, fixed, args.by, args.resamples,
            args.seed)
        differences.append((comparison, adjusted(found, args.adjust)))
    counts: dict[str, Any] = {"counted": len(episodes), "left_out": left_out,
                              "left_out_reasons": reasons}
    if args.tiers:
        counts["not_in_tiers"] = sum(ep.full.get(name) is None for ep in episodes)
    if args.json:
        out: dict[str, Any] = {"pass_at": [c.as_json() for c in cells]}
        if args.compare:
            out["compare"] = [d.as_json() for _, ds in differences for d in ds]
        out["inputs"] = _inputs_json(summary)
        out["episodes"] = counts
        out["settings"] = {
            "k": args.k, "axis": name, "budgets": args.budgets or [],
            "tiers": [c.label for c in columns if c.kind == "tier"], "hold": fixed,
            "by": args.by, "compare": [f"{c.field}={c.a},{c.b}" for c in args.compare],
            "adjust": args.adjust, "resamples": args.resamples, "seed": args.seed,
            "confidence": 0.95}
        print(json.dumps(out, indent=2, ensure_ascii=False))
    else:
        why = "; ".join(f"{n:,} {r}" for r, n in reasons.items()) or "none"
        lines = [read_line(summary), *duplicates_lines(summary),
                 f"episodes: {counts['counted']:,} counted; left out: {why}"]
        if counts.get("not_in_tiers"):
            what = "max_turns" if name == "turns" else f"budget on {name}"
            lines.append(f"{counts['not_in_tiers']:,} episodes without a {what}: not in tier "
                         "columns (give --budgets)")
        text = ["\n".join(lines) + "\n",
                axis_table.format_axis_cells(cells, args.resamples, args.seed)]
        text += [axis_table.format_axis_differences(ds, args.resamples, args.seed,
                                                    comparison=c)
                 for c, ds in differences]
        print("\n".join(text), end="")
    if all(c.value is None for c in cells):
        print("budgetproxy analyze: no eligible episodes at any B (see docs/budgets.md)",
              file=sys.stderr)
        return 1
    return 0
