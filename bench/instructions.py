"""Instructions per request, counted by valgrind's callgrind: a cost the machine's load cannot move.

On a shared machine throughput and CPU time per request drift by 10% and more between runs,
which hides the few-percent costs of metrics and tracing. Callgrind counts the instructions the
proxy process executes; counted between a warm-up and the end of a closed-loop wrk run and
divided by the requests answered, the figure repeats to about 1% (the same Python, inputs and
load give the same count whatever else the machine is doing). Python runs about 50x slower
under callgrind, so the load is light (8 connections) and start-up takes ~30 s per target.

    python bench/instructions.py                                   # observability ablation
    python bench/instructions.py --targets forwarder,budgetproxy+episodes --seconds 20
    python bench/instructions.py --cache-sim 1048576   # also: misses of a simulated 1 MB cache

With `--cache-sim BYTES` callgrind also simulates the first-level caches and a last-level cache
of BYTES (16-way, 64-byte lines; about a core's L2), and each row reports its misses per request
there: a repeatable view of how much memory a request touches, which instruction counts miss.
Under callgrind the proxy answers ~50 calls a second, so per-batch work (a trace export every
5 s) weighs far more per call than at full load.

Rows are the budgetproxy variants of bench/targets.py (and `forwarder`, the bare Starlette +
aiohttp baseline); ratios are against the first row. A feature row measured beside the row
without its feature (token, cost or time budgets beside `budgetproxy+episodes`, capture beside
`bp+episodes-tokenfields`, which gets the same answers) is judged against the 5% target:

    python bench/instructions.py --features    # those six rows, about 7 minutes
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import loadgen  # noqa: E402
import targets as tg  # noqa: E402

FEATURE_ROWS = ("budgetproxy+episodes,bp+episodes-tokens,bp+episodes-cost,bp+episodes-time,"
                "bp+episodes-tokenfields,bp+episodes-capture")
DEFAULT_TARGETS = (
    "bp+episodes-unobserved,budgetproxy+episodes,bp+episodes-traced,bp+episodes-traced-10pct"
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--targets", default=DEFAULT_TARGETS,
                   help="comma-separated rows; the first is the baseline for the ratios")
    p.add_argument("--features", action="store_true",
                   help="the feature rows and their baselines (" + FEATURE_ROWS + ")")
    p.add_argument("--seconds", type=float, default=15.0, help="counted load per target")
    p.add_argument("--warmup", type=float, default=8.0,
                   help="uncounted load first; longer than OTEL_BSP_SCHEDULE_DELAY (5 s), so the"
                   " first trace export, with its imports and connection, is not counted")
    p.add_argument("--connections", type=int, default=8)
    p.add_argument("--repeat", type=int, default=1, help="rounds over all targets")
    p.add_argument("--out", type=Path, default=tg.BENCH_DIR / "results")
    p.add_argument("--cache-sim", type=int, metavar="BYTES", default=0,
                   help="also simulate caches, the last level of BYTES, and report its misses")
    p.add_argument("--keep", action="store_true",
                   help="keep the callgrind files (for callgrind_annotate) and logs")
    args = p.parse_args(argv)
    if args.features:
        args.targets = FEATURE_ROWS
    return args


def callgrind_control(pid: int, action: str) -> None:
    out = subprocess.run(["callgrind_control", action, str(pid)], capture_output=True,
                         text=True, timeout=60)
    if out.returncode != 0 or "OK" not in out.stdout:
        raise RuntimeError(f"callgrind_control {action} {pid} failed: {out.stdout} {out.stderr}")


def dumped_events(prefix: Path) -> dict[str, int]:
    """The `summary:` counts, by event (Ir, and with cache simulation D1mr, DLmr ...), of the
    latest dump callgrind wrote for ``prefix``."""
    dumps = sorted(prefix.parent.glob(prefix.name + ".*"), key=lambda p: p.stat().st_mtime)
    for path in reversed(dumps):
        events = ["Ir"]
        for line in path.read_text(errors="replace").splitlines():
            if line.startswith("events:"):
                events = line.split()[1:]
            elif line.startswith("summary:"):
                return dict(zip(events, map(int, line.split()[1:]), strict=False))
    raise RuntimeError(f"no callgrind dump with a summary for {prefix}")


def count(workdir: Path, upstream: str, name: str, args: argparse.Namespace,
          round_no: int) -> dict[str, Any]:
    slug = f"{name.replace('+', '-')}-{round_no}"
    prefix = workdir / f"{slug}.callgrind"
    cache = (["--cache-sim=yes", f"--LL={args.cache_sim},16,64"] if args.cache_sim
             else ["--cache-sim=no"])
    wrapper = ["valgrind", "--tool=callgrind", *cache, f"--callgrind-out-file={prefix}"]
    if name == "forwarder":
        target = tg.start_forwarder(workdir, upstream, wrapper, ready_timeout=300)
    else:
        target = tg.start_budgetproxy(workdir, upstream, name, wrapper, ready_timeout=300)
    try:
        if target.skip or target.pid is None:
            return {"skip": target.skip or "did not start"}
        loadgen.run_wrk(target, args.connections, args.warmup)
        callgrind_control(target.pid, "-z")
        res = loadgen.run_wrk(target, args.connections, args.seconds)
        callgrind_control(target.pid, "-d")
        time.sleep(0.5)
        events = dumped_events(prefix)
    finally:
        tg.stop(target.proc)
    if not res.requests or res.errors:
        return {"skip": f"{res.requests} requests, {res.errors} errors"}
    out = {"requests": res.requests, "instructions": events["Ir"],
           "per_request": events["Ir"] / res.requests}
    if args.cache_sim:
        ll = sum(events.get(e, 0) for e in ("ILmr", "DLmr", "DLmw"))
        out |= {"events": events, "ll_misses_per_request": ll / res.requests}
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    missing = [t for t in ("valgrind", "callgrind_control", "wrk") if shutil.which(t) is None]
    if missing:
        print(f"needs {', '.join(missing)} (Debian: apt-get install valgrind wrk)",
              file=sys.stderr)
        return 2
    names = [n.strip() for n in args.targets.split(",") if n.strip()]
    unknown = [n for n in names if n != "forwarder" and not tg.is_budgetproxy_row(n)]
    if unknown:
        print(f"unknown targets: {', '.join(unknown)}; choose from forwarder, "
              f"{', '.join(tg.BUDGETPROXY_VARIANTS)}", file=sys.stderr)
        return 2
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    rows: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    tmp = tempfile.mkdtemp(prefix="budgetproxy-instr-")
    try:
        workdir = Path(tmp)
        upstream = tg.start_upstream(workdir, 4, 0.0)
        try:
            for r in range(args.repeat):
                for name in names:
                    print(f"round {r + 1}/{args.repeat}: {name} under callgrind...", flush=True)
                    rows[name].append(count(workdir, upstream.base_url, name, args, r))
        finally:
            tg.stop(upstream.proc)
    finally:
        if args.keep:
            print(f"callgrind files and logs: {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    base = _median(rows[names[0]])
    ll_base = _median(rows[names[0]], "ll_misses_per_request")
    print(f"\n{'target':28} {'requests':>9} {'instr/req':>11} {'x ' + names[0]:>12}"
          + (f" {'LL misses/req':>14} {'x ' + names[0]:>12}" if args.cache_sim else ""))
    print("-" * (64 + (28 if args.cache_sim else 0)))
    summary = {}
    for name in names:
        per = _median(rows[name])
        if per is None:
            print(f"{name:28} {'-':>9} {'-':>11}  {rows[name][-1].get('skip', '')}")
            continue
        reqs = sum(r.get("requests", 0) for r in rows[name])
        ratio = per / base if base else None
        summary[name] = {"instructions_per_request": round(per),
                         "ratio": round(ratio, 3) if ratio else None}
        line = f"{name:28} {reqs:>9} {per / 1000:>10.0f}k {ratio or 0:>11.3f}x"
        ll = _median(rows[name], "ll_misses_per_request")
        if ll is not None:
            summary[name]["ll_misses_per_request"] = round(ll)
            line += f" {ll:>14.0f} {ll / ll_base if ll_base else 0:>11.3f}x"
        print(line)
    verdicts = feature_verdicts(summary)
    if verdicts:
        print()
        print("\n".join(verdicts))
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / f"instructions-{stamp}.json"
    out.write_text(json.dumps({"stamp": stamp, "args": {k: str(v) for k, v in
                                                         vars(args).items()},
                               "rows": rows, "summary": summary}, indent=2))
    print(f"\nresults: {out}")
    return 0


# The feature targets (issue: budgets on tokens, cost and time and token capture cost <= 5%
# each): a row's instructions per call against the row without the feature, same answers.
FEATURE_TARGET = 1.05
FEATURE_BASELINES = {
    "bp+episodes-tokens": "budgetproxy+episodes",
    "bp+episodes-cost": "budgetproxy+episodes",
    "bp+episodes-time": "budgetproxy+episodes",
    "bp+episodes-axes": "budgetproxy+episodes",
    "bp+episodes-capture": "bp+episodes-tokenfields",  # the same answers, passed through
}


def feature_verdicts(summary: dict[str, dict[str, Any]]) -> list[str]:
    """MET / MISSED for each feature row measured beside its baseline row."""
    lines = []
    for name, base in FEATURE_BASELINES.items():
        row, ref = summary.get(name), summary.get(base)
        if row is None or ref is None:
            continue
        ratio = row["instructions_per_request"] / ref["instructions_per_request"]
        verdict = "MET" if ratio <= FEATURE_TARGET else "MISSED"
        lines.append(f"{name}: {ratio:.3f}x {base}'s instructions per call "
                     f"(target <= {FEATURE_TARGET}x) {verdict}")
    return lines


def _median(runs: list[dict[str, Any]], key: str = "per_request") -> float | None:
    vals = sorted(r[key] for r in runs if key in r)
    return vals[len(vals) // 2] if vals else None


if __name__ == "__main__":
    raise SystemExit(main())
