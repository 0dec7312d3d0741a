"""Benchmark budgetproxy side by side with the upstream, a minimal forwarder, nginx, LiteLLM and
Portkey's gateway.

    python bench/run.py                 # default run, about 2-3 minutes
    python bench/run.py --quick         # c=1 and c=32 only, shorter runs
    python bench/run.py --streams 1000  # also hold 1,000 slow streams per proxy
    python bench/run.py --with-litellm  # create LiteLLM's venv if missing and include it
    python bench/run.py --with-portkey  # npm-install Portkey's gateway if missing (needs Node)
    python bench/run.py --apis responses,messages  # also the Responses and Messages rows

Servers run pinned to core 1, the upstream and load generators to core 0 (when taskset exists).
Results go to bench/results/<timestamp>.json; see bench/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import loadgen  # noqa: E402
import profiling  # noqa: E402
import report  # noqa: E402
import targets as tg  # noqa: E402

ALL_TARGETS = [
    "direct", "forwarder", "budgetproxy", "budgetproxy+episodes", "budgetproxy+redis", "nginx",
    "litellm", "portkey",
]
STREAM_CHUNKS = 64
STREAM_GAP_MS = 20.0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="c=1 and c=32 only, shorter runs")
    p.add_argument(
        "--levels", default=None, help="concurrency levels, e.g. 1,32 (default 1,32,256)"
    )
    p.add_argument(
        "--duration",
        type=float,
        default=None,
        help="seconds per wrk run (default 3, or 2 with --quick)",
    )
    p.add_argument(
        "--repeat",
        type=int,
        default=None,
        help="interleaved rounds per concurrency level, medians reported (default 2, 1 quick);"
        " ratios are medians of each round's ratio",
    )
    p.add_argument(
        "--baseline",
        default=None,
        help="the row ratios are against (default forwarder; the targets are judged only then)",
    )
    p.add_argument(
        "--targets",
        default=",".join(ALL_TARGETS),
        help=f"comma-separated subset of {','.join(ALL_TARGETS)}; ablations: "
        + ",".join(list(tg.BUDGETPROXY_VARIANTS)[3:])
        + "; any budgetproxy row at a git revision: NAME@REV (e.g. budgetproxy+episodes@main~3)",
    )
    p.add_argument(
        "--with-litellm",
        action="store_true",
        help=f"create {tg.LITELLM_VENV.name} with {tg.LITELLM_SPEC} if missing (slow)",
    )
    p.add_argument("--no-litellm", action="store_true", help="leave LiteLLM out even if present")
    p.add_argument(
        "--with-portkey",
        action="store_true",
        help=f"install Portkey's gateway if missing ({tg.PORTKEY_INSTALL}; needs Node.js)",
    )
    p.add_argument(
        "--stream-rounds",
        type=int,
        default=None,
        help="rounds of 10 concurrent 64-chunk streams (default 3, 1 with --quick)",
    )
    p.add_argument("--no-stream-latency", action="store_true")
    p.add_argument(
        "--streams",
        type=int,
        default=0,
        help="also hold this many concurrent slow streams (one chunk a second)",
    )
    p.add_argument(
        "--slow-chunks",
        type=int,
        default=20,
        help="chunks per slow stream (so it lasts this many seconds)",
    )
    p.add_argument(
        "--profile",
        default="",
        help="comma-separated targets to sample with py-spy during an extra c=32 run",
    )
    p.add_argument(
        "--apis",
        default="",
        help="also load these APIs (responses,messages) plainly at c=32 and streamed, on the "
        "upstream directly and the budgetproxy rows",
    )
    p.add_argument("--out", type=Path, default=tg.BENCH_DIR / "results")
    p.add_argument("--keep", action="store_true", help="keep the temporary dir (logs, configs)")
    return p.parse_args(argv)


def prepare_process() -> list[str]:
    notes = tg.pin_to_client_core("servers and load generator")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else 65536
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    return notes


def start_targets(
    names: list[str], workdir: Path, upstream: str, args: argparse.Namespace
) -> list[tg.Target]:
    started: list[tg.Target] = []
    for name in names:
        print(f"starting {name}...", flush=True)
        if name == "forwarder":
            t = tg.start_forwarder(workdir, upstream)
        elif tg.is_budgetproxy_row(name):
            t = tg.start_budgetproxy(workdir, upstream, name)
        elif name == "nginx":
            t = tg.start_nginx(workdir, upstream)
        elif name == "litellm":
            t = tg.start_litellm(workdir, upstream, create=args.with_litellm)
        elif name == "portkey":
            t = tg.start_portkey(workdir, upstream, create=args.with_portkey)
        else:
            raise SystemExit(f"unknown target {name!r}")
        if t.skip:
            print(f"  skipped: {t.skip}", flush=True)
        started.append(t)
    return started


def median_result(results: list[loadgen.WrkResult]) -> dict[str, Any]:
    if len(results) == 1:
        return loadgen.as_dict(results[0])
    out = loadgen.as_dict(results[0])
    for key in ("rps", "p50_ms", "p90_ms", "p99_ms", "p999_ms", "max_ms", "cpu_us_per_req"):
        values = [getattr(r, key) for r in results if getattr(r, key) is not None]
        out[key] = round(statistics.median(values), 3) if values else None
    out["requests"] = sum(r.requests for r in results)
    out["errors"] = sum(r.errors for r in results)
    out["runs"] = [loadgen.as_dict(r) for r in results]
    return out


def measure_api(api: str, targets: list[tg.Target], duration: float, repeat: int,
                rounds: int, streams: bool) -> dict[str, Any]:
    """One API's rows: c=32 wrk rounds interleaved over the targets, then stream latency."""
    for t in targets:  # warm-up of this route
        loadgen.run_wrk(t, 32, 1.0, api)
    results: dict[str, list[loadgen.WrkResult]] = {t.name: [] for t in targets}
    for _ in range(repeat):
        for t in targets:
            print(f"wrk c=32 {t.name} {api}...", flush=True)
            results[t.name].append(loadgen.run_wrk(t, 32, duration, api))
    out: dict[str, Any] = {name: {"c32": median_result(rs)} for name, rs in results.items()}
    if streams:
        for t in targets:
            print(f"streams x10 {t.name} {api}...", flush=True)
            out[t.name]["streams"] = loadgen.stream_latency(t, 10, rounds, STREAM_CHUNKS, api)
    return out


def api_table(by_target: dict[str, Any]) -> str:
    direct = by_target.get("direct", {})
    base_rps = direct.get("c32", {}).get("rps")
    base_ttft = direct.get("streams", {}).get("ttft_p50_ms")
    lines = [f"{'target':22} {'c32 req/s':>10} {'/direct':>8} {'c32 p50':>9} {'errors':>7} "
             f"{'TTFT p50':>9} {'+direct':>8} {'gap p50':>8} {'streams ok':>10}"]
    for name, row in by_target.items():
        c32, st = row["c32"], row.get("streams", {})
        ratio = f"{c32['rps'] / base_rps:.2f}x" if base_rps else "-"
        ttft, gap = st.get("ttft_p50_ms"), st.get("gap_p50_ms")
        added = f"{ttft - base_ttft:+.2f}ms" if ttft is not None and base_ttft is not None else "-"
        ok = f"{st['completed']}/{st['streams']}" if st else "-"
        lines.append(
            f"{name:22} {c32['rps']:>10.0f} {ratio:>8} {c32['p50_ms']:>7.2f}ms "
            f"{c32['errors']:>7} {f'{ttft:.2f}ms' if ttft is not None else '-':>9} {added:>8} "
            f"{f'{gap:.2f}ms' if gap is not None else '-':>8} {ok:>10}")
    return "\n".join(lines)


def git_revision() -> str:
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=tg.REPO_DIR,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return rev


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    duration = args.duration or (2.0 if args.quick else 3.0)
    repeat = args.repeat or (1 if args.quick else 2)
    levels = [1, 32] if args.quick else [1, 32, 256]
    if args.levels:
        levels = sorted({int(c) for c in args.levels.split(",")})
    rounds = args.stream_rounds or (1 if args.quick else 3)
    names = [n.strip() for n in args.targets.split(",") if n.strip()]
    if args.no_litellm and "litellm" in names:
        names.remove("litellm")
    # Checked before anything starts, so a typo leaves no server behind.
    known = {*ALL_TARGETS, *tg.BUDGETPROXY_VARIANTS}
    unknown = [n for n in names if n not in known and not tg.is_budgetproxy_row(n)]
    if unknown:
        raise SystemExit(f"unknown target(s) {', '.join(unknown)}; choose from "
                         + ", ".join(sorted(known)))
    if len(set(names)) != len(names):
        raise SystemExit("--targets names a row twice")
    if args.baseline is None:
        args.baseline = report.BASELINE
    elif args.baseline not in names:
        raise SystemExit(f"--baseline {args.baseline} is not one of --targets")
    if not shutil.which("wrk"):
        raise SystemExit("wrk not found (apt-get install wrk)")
    notes = prepare_process()
    workdir = Path(tempfile.mkdtemp(prefix="budgetproxy-bench-"))
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    began = time.monotonic()
    upstream = tg.start_upstream(workdir, STREAM_CHUNKS, STREAM_GAP_MS)
    measured: list[tg.Target] = [upstream] if "direct" in names else []
    others: list[tg.Target] = []
    rows: dict[str, dict[str, Any]] = {}
    api_rows: dict[str, dict[str, Any]] = {}
    try:
        others = start_targets(
            [n for n in names if n != "direct"], workdir, upstream.base_url, args
        )
        measured += [t for t in others if not t.skip]
        for t in [upstream, *others]:
            if t.name in names:
                rows[t.name] = {"description": t.description, "skip": t.skip, "wrk": {}}
        for t in measured:  # warm-up: connection pools, caches, lazy imports
            loadgen.run_wrk(t, 32, t.warmup_s)
        for c in levels:
            results: dict[str, list[loadgen.WrkResult]] = {t.name: [] for t in measured}
            for _ in range(repeat):
                for t in measured:
                    print(f"wrk c={c} {t.name}...", flush=True)
                    seconds = max(duration, t.min_run_s_c256) if c >= 256 else duration
                    results[t.name].append(loadgen.run_wrk(t, c, seconds))
            for name, rs in results.items():
                rows[name]["wrk"][f"c{c}"] = median_result(rs)
        if not args.no_stream_latency:
            for t in measured:
                print(f"streams x10 {t.name}...", flush=True)
                rows[t.name]["streams"] = loadgen.stream_latency(t, 10, rounds, STREAM_CHUNKS)
        if args.streams:
            for t in measured:
                if not t.forwards_headers:
                    rows[t.name]["slow_streams_skip"] = "does not forward X-Fake-* headers"
                    continue
                print(f"{args.streams} slow streams {t.name}...", flush=True)
                rows[t.name]["slow_streams"] = loadgen.slow_streams(
                    t, args.streams, args.slow_chunks
                )
        apis = [a.strip() for a in args.apis.split(",") if a.strip()]
        unknown_apis = [a for a in apis if a not in loadgen.API_PATHS]
        if unknown_apis:
            raise SystemExit(f"unknown --apis {', '.join(unknown_apis)}")
        api_targets = [t for t in measured
                       if t.name == "direct" or t.name in tg.BUDGETPROXY_VARIANTS]
        for api in apis:
            api_rows[api] = measure_api(api, api_targets, duration, repeat, rounds,
                                        not args.no_stream_latency)
        for t in measured:
            if t.name in args.profile.split(","):
                print(f"profiling {t.name} under c=32...", flush=True)
                rows[t.name]["profile"] = profiling.profile_under_load(
                    t, max(duration, 5.0), args.out, stamp
                )
    finally:
        for t in [*others, upstream]:
            tg.stop(t.proc)
    summary = report.summarize(rows, levels, args.baseline)
    if args.baseline not in rows or rows[args.baseline].get("skip"):
        notes.append(f"no ratios: the baseline row {args.baseline} was not measured")
    print()
    print(f"ratios against {args.baseline}: "
          + (f"medians of the {repeat} rounds' ratios" if repeat > 1 else "one round"))
    print(report.table(rows, summary, levels, args.baseline))
    noisy = report.noise_note(summary, levels)
    if noisy:
        notes.append(noisy)
    streams = report.stream_table(rows, summary, args.baseline)
    if streams:
        print(
            f"\nStreams: {rounds} round(s) of 10 concurrent, {STREAM_CHUNKS} chunks "
            f"{STREAM_GAP_MS:.0f} ms apart; overheads vs direct"
        )
        print(streams)
    for api, by_target in api_rows.items():
        print(f"\n/v1{loadgen.API_PATHS[api]}: c=32 and 10 concurrent streams; ratios vs direct")
        print(api_table(by_target))
    slow = report.slow_table(rows)
    if slow:
        print(f"\nSlow streams: {args.streams} concurrent, one chunk a second")
        print(slow)
    print()
    verdicts = [*report.verdicts(summary, args.baseline),
                *report.ttft_verdicts(summary, api_rows, args.baseline)]
    for line in verdicts:
        print(line)
    for note in notes:
        print(f"note: {note}")

    for name, row in rows.items():
        if "profile" in row:
            profiling.print_summary(name, row["profile"])
    result = {
        "schema": 1,
        "started_at": stamp,
        "seconds": round(time.monotonic() - began, 1),
        "revision": git_revision(),
        "settings": {
            "duration_s": duration,
            "levels": levels,
            "repeat": repeat,
            "stream_rounds": rounds,
            "stream_chunks": STREAM_CHUNKS,
            "stream_gap_ms": STREAM_GAP_MS,
            "slow_streams": args.streams,
            "episodes": tg.EPISODES,
        },
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "system": platform.system(),
            "pinned": shutil.which("taskset") is not None,
        },
        "notes": notes,
        "targets": rows,
        "apis": api_rows,
        "summary": summary,
        "baseline": args.baseline,
        "verdicts": verdicts,
    }
    path = args.out / f"bench-{stamp}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nresults: {path}")
    if args.keep:
        print(f"logs and configs: {workdir}")
    else:
        with contextlib.suppress(OSError):
            shutil.rmtree(workdir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
