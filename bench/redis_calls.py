"""What one model call asks of Redis: commands, writes and Redis's CPU time per answered call.

Each row runs alone under closed-loop wrk; the Redis the rows use (127.0.0.1:6379, as in
bench/targets.py) is read with INFO before and after the counted run, and the differences are
divided by the calls answered. `client writes` is Redis's count of reads it processed: about
one per write a client made, so per call it says how many round trips the calls' commands
were packed into. Commands include those a script runs (Redis counts both); Redis's CPU is its
process's user and system time over the run, per call. Other clients of
the same Redis are counted too: run it where nothing else uses that Redis.

    python bench/redis_calls.py --targets budgetproxy+redis@main,budgetproxy+redis
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import loadgen  # noqa: E402
import targets as tg  # noqa: E402


def redis_stats() -> dict[str, float]:
    out = subprocess.run(["redis-cli", "info", "all"], capture_output=True, text=True,
                         check=True).stdout
    stats: dict[str, float] = {}
    for line in out.strip().splitlines():
        name, _, value = line.strip().partition(":")
        if name in ("total_commands_processed", "total_reads_processed"):
            stats[name] = int(value)
        elif name in ("used_cpu_user", "used_cpu_sys"):
            stats["cpu_s"] = stats.get("cpu_s", 0.0) + float(value)
        elif name.startswith("cmdstat_"):
            fields = dict(kv.split("=") for kv in value.split(","))
            stats[name[8:]] = int(fields["calls"])
    return stats


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--targets", default="budgetproxy+redis", help="comma-separated rows")
    p.add_argument("--connections", type=int, default=32)
    p.add_argument("--seconds", type=float, default=5.0)
    args = p.parse_args(argv)
    if shutil.which("redis-cli") is None:
        raise SystemExit("redis-cli is not on PATH")
    work = Path(tempfile.mkdtemp(prefix="bench-redis-calls-"))
    upstream = tg.start_upstream(work, 8, 0.0)
    try:
        for name in args.targets.split(","):
            t = tg.start_budgetproxy(work, upstream.base_url, name)
            if t.skip:
                print(f"{name}: skipped ({t.skip})")
                continue
            try:
                loadgen.run_wrk(t, args.connections, 2)  # warm-up, not counted
                before = redis_stats()
                res = loadgen.run_wrk(t, args.connections, args.seconds)
                after = redis_stats()
            finally:
                tg.stop(t.proc)
            n = max(1, res.requests)
            d = {k: after.get(k, 0) - before.get(k, 0) for k in after}
            top = ", ".join(f"{k} {v / n:.2f}" for k, v in sorted(d.items())
                            if k not in ("total_commands_processed", "total_reads_processed",
                                         "cpu_s") and v / n >= 0.01)
            print(f"{name}: {res.requests} calls, {res.rps:.0f}/s; per call: "
                  f"{d['total_commands_processed'] / n:.2f} commands ({top}); "
                  f"{d['total_reads_processed'] / n:.3f} client writes; "
                  f"Redis's CPU {1e6 * d['cpu_s'] / n:.1f} us")
    finally:
        tg.stop(upstream.proc)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
