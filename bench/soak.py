"""Soak: budgetproxy under a fixed call rate for minutes; is its memory flat after warm-up?

    python bench/soak.py                              # 15 min, 300 calls/s, 1,000 episode slots
    python bench/soak.py --minutes 1 --rate 200       # a quick check of the rate first

Starts the fake upstream and `budgetproxy serve` (memory store or --store redis://..., disclosed
arm, trajectories to a temp dir, metrics on), drives agents through rotating episodes at a fixed
rate (open loop, see soak_agents.py), samples the proxy every few seconds, then stops it with
SIGTERM and checks the trajectory log against what the agents were answered. Writes
soak-<stamp>.json and .svg to
--out. Exit status 0 when memory is flat, nothing was lost and no call failed; 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import gzip
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))

import soak_report  # noqa: E402
import targets as tg  # noqa: E402
from soak_agents import AgentLoad, Load  # noqa: E402

MIB = 1024 * 1024
SOAK_PREFIX = f"bpsoak{os.getpid()}"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=15.0, help="length of the load (default 15)")
    p.add_argument("--rate", type=float, default=300.0, help="model calls a second (default 300)")
    p.add_argument("--episodes", type=int, default=1000,
                   help="episode slots: concurrent agents, each a new episode id when its "
                        "episode ends (default 1000)")
    p.add_argument("--stream-share", type=float, default=0.1,
                   help="share of calls that stream (default 0.1)")
    p.add_argument("--sample-s", type=float, default=5.0, help="seconds between samples")
    p.add_argument("--warmup-minutes", type=float, default=None,
                   help="excluded from the post-warm-up figures (default: a fifth of the run, "
                        "at most 3 minutes)")
    p.add_argument("--max-slope", type=float, default=4.0,
                   help="MiB/hour of RSS growth over the second half still called flat")
    p.add_argument("--max-excursion", type=float, default=16.0,
                   help="MiB the RSS may peak above its post-warm-up median")
    p.add_argument("--retention-s", type=float, default=None,
                   help="episodes.retention_s for the proxy (default: the proxy's own)")
    p.add_argument("--store", default="memory", metavar="memory|redis://HOST:PORT/DB",
                   help="the proxy's episode store (default memory); with a Redis URL the "
                        "soak uses its own key prefix and deletes its keys at the end")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=tg.BENCH_DIR / "results")
    p.add_argument("--keep", action="store_true", help="keep the temp dir (logs, trajectories)")
    return p.parse_args(argv)


def start_proxy(
    workdir: Path, upstream: str, args: argparse.Namespace, extra: Sequence[str] = ()
) -> tg.Target:
    """`budgetproxy serve` on the disclosed arm; `extra` are further config lines (YAML)."""
    port = tg.free_port()
    config = workdir / "soak.yaml"
    lines = [
        "# bench/soak.py: the defaults, with the disclosed arm",
        "disclosure: {mode: disclosed, placement: last_message, history: keep}",
        "tracing: {enabled: false}",
        *extra,
    ]
    if args.retention_s is not None:
        lines.append(f"episodes: {{retention_s: {args.retention_s}}}")
    if args.store != "memory":
        lines.append(f"store: {{kind: redis, url: '{args.store}', key_prefix: '{SOAK_PREFIX}'}}")
    config.write_text("\n".join(lines) + "\n")
    target = tg.Target("budgetproxy", "budgetproxy serve, disclosed arm",
                       f"http://127.0.0.1:{port}/v1", log_path=workdir / "budgetproxy.log")
    argv = [sys.executable, "-m", "budgetproxy", "serve", "--port", str(port), "--config",
            str(config), "--log-dir", str(workdir / "trajectories"), "--upstream", upstream]
    target.proc = tg.spawn(argv, workdir / "budgetproxy.log")
    if not tg.wait_ready(target):
        raise SystemExit(f"budgetproxy did not start: {target.skip}")
    return target


# ---- sampling ------------------------------------------------------------------------------


def proc_memory(pid: int) -> dict[str, float]:
    """VmRSS, RssAnon and VmHWM of one process, in MiB."""
    out: dict[str, float] = {}
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "VmHWM"):
                out[key] = int(value.split()[0]) / 1024
    return out


def dir_bytes(path: Path) -> int:
    total = 0
    with contextlib.suppress(OSError):
        for entry in os.scandir(path):
            with contextlib.suppress(OSError):
                total += entry.stat().st_size
    return total


HEAP_IN_USE = 'budgetproxy_heap_bytes{state="in_use"}'
HEAP_FREE = 'budgetproxy_heap_bytes{state="free"}'


def _mib(value: float | None) -> float | None:
    return None if value is None else round(value / MIB, 2)


def metric_values(text: str, names: tuple[str, ...]) -> dict[str, float]:
    """Samples of `names` from Prometheus text (a labelled one named with its labels, as
    written: `name{label="value"}`)."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in names:
            found[name] = float(value)
    return found


async def sample(
    load: Load | None, proxy: tg.Target, traj: Path, session: aiohttp.ClientSession,
    t0: float, last: dict[str, float],
) -> dict[str, Any]:
    pid = proxy.pid
    assert pid is not None
    now = time.monotonic()
    # /proc and the log folder are read off the loop, so sampling never delays a due call.
    mem, cpu, log_bytes = await asyncio.to_thread(
        lambda: (proc_memory(pid), tg.cpu_seconds(pid), dir_bytes(traj)))
    gauges: dict[str, float] = {}
    with contextlib.suppress(aiohttp.ClientError, TimeoutError):
        async with session.get(proxy.base_url.removesuffix("/v1") + "/metrics") as resp:
            gauges = metric_values(await resp.text(), (
                "budgetproxy_trajectory_queue_depth", "budgetproxy_active_episodes",
                HEAP_IN_USE, HEAP_FREE))
    dt_s = max(1e-6, now - last["t"])
    row: dict[str, Any] = {
        "t_s": round(now - t0, 2),
        "rss_mib": round(mem.get("VmRSS", 0.0), 2),
        "anon_mib": round(mem.get("RssAnon", 0.0), 2),
        "hwm_mib": round(mem.get("VmHWM", 0.0), 2),
        "cpu_pct": round(100 * (cpu - last["cpu"]) / dt_s, 1),
        "queue_depth": gauges.get("budgetproxy_trajectory_queue_depth"),
        "active_episodes": gauges.get("budgetproxy_active_episodes"),
        "trajectory_mib": round(log_bytes / MIB, 2),
        # glibc's heap inside the proxy (its idle sweep's reading): kept, and free between
        "heap_in_use_mib": _mib(gauges.get(HEAP_IN_USE)),
        "heap_free_mib": _mib(gauges.get(HEAP_FREE)),
    }
    last.update(t=now, cpu=cpu)
    if load is not None:
        w = load.take_window()
        span = max(1e-6, now - w.started)
        row |= {
            "calls_per_s": round(w.completed / span, 1),
            "scheduled_per_s": round(w.scheduled / span, 1),
            "p50_ms": tg.percentile(w.latencies_ms, 50, 2),
            "p99_ms": tg.percentile(w.latencies_ms, 99, 2),
            "max_ms": round(max(w.latencies_ms), 2) if w.latencies_ms else None,
            "ok": w.ok, "streams": w.streams, "rejected_403": w.rejected,
            "outcomes": w.outcomes, "errors": w.errors, "unsent": w.unsent,
            "episodes_started": load.episodes_started,
        }
    return row


def progress(row: dict[str, Any]) -> str:
    return (f"{row['t_s']:7.0f}s  rss {row['rss_mib']:6.1f} MiB  cpu {row['cpu_pct']:5.1f}%  "
            f"{row.get('calls_per_s', 0):6.1f} calls/s  p50 {row.get('p50_ms')} ms  "
            f"p99 {row.get('p99_ms')} ms  errors {row.get('errors', 0)}  "
            f"queue {row['queue_depth']}  episodes {row.get('episodes_started', 0)}  "
            f"log {row['trajectory_mib']:.0f} MiB")


async def drive(
    args: argparse.Namespace, proxy: tg.Target, traj: Path, samples_path: Path
) -> tuple[AgentLoad, list[dict[str, Any]]]:
    load = AgentLoad(proxy.base_url, rate=args.rate, slots=args.episodes,
                     stream_share=args.stream_share, seed=args.seed,
                     shutdown_ends_episodes=args.store == "memory")
    rows = await sample_while(load, args.minutes * 60, args.sample_s, proxy, traj, samples_path)
    return load, rows


async def sample_while(
    load: Load, seconds: float, sample_s: float, proxy: tg.Target, traj: Path,
    samples_path: Path, print_every_s: float = 0.0,
    more: Callable[[], dict[str, Any]] | None = None,
    describe: Callable[[dict[str, Any]], str] = progress,
) -> list[dict[str, Any]]:
    """Run the load for `seconds`, sampling the proxy every `sample_s` (each sample joined by
    what `more` returns, printed at most every `print_every_s`); the samples."""
    rows: list[dict[str, Any]] = []
    assert proxy.pid is not None
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        t0 = time.monotonic()
        last = {"t": t0, "cpu": tg.cpu_seconds(proxy.pid)}
        idle = await sample(None, proxy, traj, session, t0, last)
        rows.append(idle)
        running = asyncio.create_task(load.run(seconds))
        printed = -print_every_s
        with samples_path.open("w") as log:
            log.write(json.dumps(idle) + "\n")
            next_at = t0
            while not running.done():
                next_at += sample_s
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(running),
                                           max(0.0, next_at - time.monotonic()))
                short = running.done() and time.monotonic() < next_at - sample_s / 10
                row = await sample(load, proxy, traj, session, t0, last)
                if more is not None:
                    row |= more()
                if short:  # the load ended inside this window: its rates mean little
                    row["partial"] = True
                rows.append(row)
                log.write(json.dumps(row) + "\n")
                log.flush()
                if short or running.done() or row["t_s"] - printed >= print_every_s - 1e-6:
                    printed = row["t_s"]
                    print(describe(row) + ("  (partial window)" if short else ""), flush=True)
        await running
    return rows


# ---- nothing lost --------------------------------------------------------------------------


def read_records(traj: Path) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    for path in sorted(traj.iterdir()):
        if path.name.endswith(".jsonl.gz"):
            opener: Any = gzip.open
        elif path.name.endswith(".jsonl"):
            opener = open
        else:
            continue
        with opener(path, "rb") as f:
            records.extend(orjson.loads(line) for line in f if line.strip())
    return records


def check_records(load: AgentLoad, traj: Path) -> dict[str, Any]:
    """Every answered turn has its record; every ended episode exactly one episode record."""
    ledger = load.ledger
    turns_ok: dict[str, int] = {}
    turns_other: dict[str, int] = {}  # neither ok nor rejected
    turns_rejected: dict[str, int] = {}
    episodes: dict[str, list[str]] = {}
    other_status: dict[str, int] = {}
    odd: list[dict[str, Any]] = []
    for r in read_records(traj):
        eid = str(r.get("episode_id"))
        if r.get("type") == "turn":
            status = r.get("status")
            if status == "ok":
                turns_ok[eid] = turns_ok.get(eid, 0) + 1
            elif status == "rejected":
                turns_rejected[eid] = turns_rejected.get(eid, 0) + 1
            else:
                turns_other[eid] = turns_other.get(eid, 0) + 1
                key = f"{status} {r.get('http_status')}"
                other_status[key] = other_status.get(key, 0) + 1
                if len(odd) < 5:
                    odd.append({k: r.get(k) for k in (
                        "episode_id", "turn", "attempt", "stream", "status", "http_status",
                        "charged", "remaining", "finish_reason", "latency_s", "ts")})
        elif r.get("type") == "episode":
            episodes.setdefault(eid, []).append(str(r.get("end_reason")))
    answered = sum(ledger.ok_turns.values())
    # Per episode: answered turns without any record are lost; answered turns whose record
    # says something other than ok are mislabelled; ok records beyond the answers are extra.
    missing_turns = mislabelled = extra_turns = 0
    uneven: list[tuple[str, int, int]] = []
    for e in set(ledger.ok_turns) | set(turns_ok):
        a, ok_n, other = ledger.ok_turns.get(e, 0), turns_ok.get(e, 0), turns_other.get(e, 0)
        short = max(0, a - ok_n)
        mislabelled += min(other, short)
        missing_turns += max(0, short - other)
        extra_turns += max(0, ok_n - a)
        if a != ok_n and len(uneven) < 5:
            uneven.append((e, a, ok_n))
    rejected_off = sum(abs(ledger.rejected.get(e, 0) - turns_rejected.get(e, 0))
                       for e in set(ledger.rejected) | set(turns_rejected))
    expected = ledger.ended
    missing_eps = [e for e in expected if e not in episodes]
    duplicate_eps = [e for e, reasons in episodes.items() if len(reasons) > 1]
    wrong_reason = [e for e, want in expected.items()
                    if e in episodes and episodes[e][0] != want]
    unexpected = [e for e in episodes if e not in expected]
    ok = not (missing_turns or extra_turns or rejected_off or missing_eps or duplicate_eps
              or wrong_reason)
    return {
        "ok": ok,
        "turns_answered_200": answered,
        "turn_records_ok": sum(turns_ok.values()),
        "turns_missing": missing_turns,
        "turns_extra": extra_turns,
        "turns_mislabelled": mislabelled,
        "probes_answered_403": sum(ledger.rejected.values()),
        "turn_records_rejected": sum(turns_rejected.values()),
        "rejected_unmatched": rejected_off,
        "turn_records_other": other_status,
        "episodes_expected": len(expected),
        "episode_records": sum(len(v) for v in episodes.values()),
        "episodes_missing": len(missing_eps),
        "episodes_duplicated": len(duplicate_eps),
        "episodes_wrong_end_reason": len(wrong_reason),
        "episodes_unexpected": len(unexpected),
        "end_reasons": {r: sum(1 for v in expected.values() if v == r)
                        for r in ("success", "failure", "exhausted", "abandoned")},
        "examples": {"turns_answered_vs_logged_ok": uneven, "missing": missing_eps[:5],
                     "duplicated": duplicate_eps[:5], "wrong_end_reason": wrong_reason[:5],
                     "unexpected": unexpected[:5], "turn_records_other": odd},
    }


def git_revision() -> dict[str, Any]:
    """HEAD, and the package files that differ from it (the install is editable)."""
    def git(*argv: str) -> str:
        return subprocess.run(["git", *argv], cwd=tg.REPO_DIR, capture_output=True, text=True,
                              check=True).stdout.strip()

    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        return {"head": git("rev-parse", "--short", "HEAD"),
                "changed": git("status", "--porcelain", "--", "budgetproxy").splitlines()}
    return {"head": "unknown", "changed": []}


def drop_keys(url: str) -> None:
    """Delete the soak's keys from Redis (its own prefix: nothing else is touched)."""
    import redis

    client = redis.Redis.from_url(url)
    try:
        for key in client.scan_iter(match=f"{SOAK_PREFIX}:*", count=1000):
            client.unlink(key)
    except redis.RedisError as e:
        print(f"soak: could not delete the {SOAK_PREFIX}:* keys: {e}", file=sys.stderr)
    finally:
        client.close()


def stop_timed(proxy: tg.Target) -> tuple[float, int | None]:
    """SIGTERM the proxy: how long it took to stop, and its exit code."""
    began = time.monotonic()
    tg.stop(proxy.proc)
    return time.monotonic() - began, None if proxy.proc is None else proxy.proc.returncode


def run_loop(coro: Any) -> Any:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    notes = tg.pin_to_client_core("proxy, upstream and agents")
    revision = git_revision()  # now: the tree may move on during a long run
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    workdir = Path(tempfile.mkdtemp(prefix="budgetproxy-soak-"))
    traj = workdir / "trajectories"
    samples_path = args.out / f"soak-{stamp}-samples.jsonl"
    upstream = tg.start_upstream(workdir, chunks=8, gap_ms=0.0)
    proxy: tg.Target | None = None
    try:
        proxy = start_proxy(workdir, upstream.base_url, args)
        print(f"soak: {args.minutes:g} min at {args.rate:g} calls/s over {args.episodes} "
              f"episode slots, {100 * args.stream_share:g}% streaming; samples every "
              f"{args.sample_s:g} s to {samples_path}", flush=True)
        load, rows = run_loop(drive(args, proxy, traj, samples_path))
        shutdown_s, exit_code = stop_timed(proxy)
    except BaseException:
        print(f"soak failed; logs and config kept in {workdir}", file=sys.stderr)
        raise
    finally:
        if proxy is not None:
            tg.stop(proxy.proc)
        tg.stop(upstream.proc)
        if args.store != "memory":
            drop_keys(args.store)
    records = check_records(load, traj)
    warmup_s = 60 * (args.warmup_minutes if args.warmup_minutes is not None
                     else min(3.0, args.minutes / 5))
    summary = soak_report.summarize(rows, load, warmup_s, args.minutes * 60,
                                    args.max_slope, args.max_excursion)
    summary["shutdown_s"] = round(shutdown_s, 2)
    summary["proxy_exit_code"] = exit_code
    summary["errors_by_kind"] = dict(load.ledger.errors.most_common(20))
    verdicts = soak_report.verdicts(summary, records)
    result = {
        "schema": 1,
        "started_at": stamp,
        "revision": revision,
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
        | {"warmup_s": warmup_s},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "system": platform.system(), "pinned": shutil.which("taskset") is not None,
                    "loadavg": os.getloadavg()},
        "notes": notes,
        "summary": summary,
        "records": records,
        "verdicts": verdicts,
        "samples": rows,
    }
    json_path = args.out / f"soak-{stamp}.json"
    json_path.write_text(json.dumps(result, indent=2) + "\n")
    svg_path = args.out / f"soak-{stamp}.svg"
    svg_path.write_text(soak_report.plot(rows, summary, args))
    print()
    print(soak_report.table(summary, records))
    print()
    for line in verdicts:
        print(line)
    for note in notes:
        print(f"note: {note}")
    print(f"\nresults: {json_path}\nplot: {svg_path}")
    if args.keep:
        print(f"logs, config and trajectories: {workdir}")
    else:
        with contextlib.suppress(OSError):
            shutil.rmtree(workdir)
    flat = summary["rss"]["flat"]
    good = flat and records["ok"] and not records["turns_mislabelled"] and not summary["errors"]
    return 0 if good else 1


if __name__ == "__main__":
    raise SystemExit(main())
