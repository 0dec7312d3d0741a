"""What a feature costs: rows loaded at the same time, CPU time per request compared.

On a shared machine the speed of a core drifts by 20% and more from one few-second run to the
next (other tenants, the sibling hyperthread, frequency), so rows measured one after another
(bench/run.py) cannot resolve a 5% cost without many rounds. Here every row is loaded at once:
each server on the server core with its own closed-loop wrk (8 connections) on the client core,
so all rows see the same core in the same seconds, and the scheduler gives each an equal share.
Each row's CPU time per request (user + system, all its threads) is compared with the first
row's in every round; the median of those ratios is the figure, with the spread of the rounds.

    python bench/overhead.py        # observability: metrics, tracing unsampled / 10% / all
    python bench/overhead.py --targets bp+episodes-bare,budgetproxy+episodes --rounds 7

A row's capacity ratio is the first row's CPU per request over its own. Servers taking turns on
one core resume with cold caches, which costs rows that run more Python proportionally more, so
the ratios are somewhat lower than a dedicated core shows (bench/run.py): use them to attribute
costs between rows, and run.py to judge the targets.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import loadgen  # noqa: E402
import targets as tg  # noqa: E402

DEFAULT_TARGETS = (
    "bp+episodes-unobserved,budgetproxy+episodes,bp+episodes-traced-unsampled,"
    "bp+episodes-traced-10pct,bp+episodes-traced"
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--targets", default=DEFAULT_TARGETS,
                   help="comma-separated rows (bench/targets.py); the first is the baseline")
    p.add_argument("--rounds", type=int, default=5, help="rounds of load, all rows at once")
    p.add_argument("--seconds", type=float, default=10.0, help="load per round")
    p.add_argument("--connections", type=int, default=8, help="wrk connections per row")
    p.add_argument("--history-kb", type=int, default=0,
                   help="KB of earlier turns in each request (long agent conversations)")
    p.add_argument("--out", type=Path, default=tg.BENCH_DIR / "results", help="results folder")
    return p.parse_args(argv)


def start(name: str, workdir: Path, upstream: str) -> tg.Target:
    if name == "forwarder":
        return tg.start_forwarder(workdir, upstream)
    if tg.is_budgetproxy_row(name):
        return tg.start_budgetproxy(workdir, upstream, name)
    raise SystemExit(f"unknown target {name!r}; choose from forwarder, "
                     + ", ".join(tg.BUDGETPROXY_VARIANTS))


def load_together(rows: list[tg.Target], connections: int,
                  seconds: float) -> dict[str, loadgen.WrkResult]:
    """One wrk per row, all started at once; each measures its own server's CPU."""
    results: dict[str, loadgen.WrkResult] = {}
    errors: list[BaseException] = []

    def one(t: tg.Target) -> None:
        try:
            results[t.name] = loadgen.run_wrk(t, connections, seconds)
        except BaseException as e:  # reported after the join
            errors.append(e)

    threads = [threading.Thread(target=one, args=(t,)) for t in rows]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        raise errors[0]
    return results


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    names = [n.strip() for n in args.targets.split(",") if n.strip()]
    if len(set(names)) != len(names):
        raise SystemExit("--targets names a row twice")
    if len(names) < 2:
        raise SystemExit("name at least two rows: a baseline and one to compare")
    if not shutil.which("wrk"):
        raise SystemExit("wrk not found (apt-get install wrk)")
    if args.history_kb:
        os.environ["BENCH_HISTORY_KB"] = str(args.history_kb)  # read by bench/wrk_chat.lua
    unknown = [n for n in names if n != "forwarder" and not tg.is_budgetproxy_row(n)]
    if unknown:
        raise SystemExit(f"unknown row(s) {', '.join(unknown)}; choose from forwarder, "
                         + ", ".join(tg.BUDGETPROXY_VARIANTS))
    missing = tg.budgetproxy_missing()
    if missing:
        raise SystemExit(missing)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    notes = tg.pin_to_client_core("load generators")
    workdir = Path(tempfile.mkdtemp(prefix="budgetproxy-overhead-"))
    upstream = tg.start_upstream(workdir, 8, 0.0)
    rows: list[tg.Target] = []
    cpu: dict[str, list[float]] = {n: [] for n in names}
    rps: dict[str, list[float]] = {n: [] for n in names}
    try:
        for name in names:
            print(f"starting {name}...", flush=True)
            t = start(name, workdir, upstream.base_url)
            if t.skip:
                raise SystemExit(f"{name} did not start: {t.skip}")
            rows.append(t)
        print("warming up...", flush=True)
        load_together(rows, args.connections, max(t.warmup_s for t in rows) + 5)
        for r in range(args.rounds):
            got = load_together(rows, args.connections, args.seconds)
            for name, res in got.items():
                if res.errors or res.cpu_us_per_req is None:
                    raise SystemExit(f"{name}: {res.errors} errors in round {r + 1}")
                cpu[name].append(res.cpu_us_per_req)
                rps[name].append(res.rps)
            print(f"round {r + 1}/{args.rounds}: " + "  ".join(
                f"{n} {cpu[n][-1]:.0f}us" for n in names), flush=True)
    finally:
        for t in [*rows, upstream]:
            tg.stop(t.proc)
        shutil.rmtree(workdir, ignore_errors=True)

    base = names[0]
    summary: dict[str, dict[str, Any]] = {}
    for name in names:
        ratios = [b / c for b, c in zip(cpu[base], cpu[name], strict=True)]
        summary[name] = {
            "cpu_us_per_req": round(statistics.median(cpu[name]), 1),
            "capacity_vs_baseline": round(statistics.median(ratios), 3),
            "capacity_min": round(min(ratios), 3),
            "capacity_max": round(max(ratios), 3),
            "rps": round(statistics.median(rps[name]), 1),
        }
    width = max(len(n) for n in names)
    print(f"\n{args.rounds} rounds of {args.seconds:.0f} s, all rows at once, "
          f"{args.connections} connections each; capacity = {base}'s CPU per request / the row's")
    print(f"{'target':{width}}  CPU/req   capacity  (rounds' range)")
    for name, s in summary.items():
        print(f"{name:{width}}  {s['cpu_us_per_req']:5.0f}us   {s['capacity_vs_baseline']:.3f}x"
              f"   ({s['capacity_min']:.3f}-{s['capacity_max']:.3f})")
    for note in notes:
        print(f"note: {note}")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"overhead-{stamp}.json"
    path.write_text(json.dumps({
        "schema": 1, "started_at": stamp, "baseline": base, "rounds": args.rounds,
        "seconds": args.seconds, "connections": args.connections, "history_kb": args.history_kb,
        "cpu_us_per_req": cpu, "rps": rps, "summary": summary, "notes": notes,
    }, indent=2) + "\n")
    print(f"\nresults: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
