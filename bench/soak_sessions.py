"""Session soak: Claude-Code-like sessions through budgetproxy for minutes; flat memory, nothing
lost, every budget text kept, every prompt append-only?

    python bench/soak_sessions.py                         # 15 min, 8 concurrent sessions
    python bench/soak_sessions.py --minutes 2             # a quick check first
    python bench/soak_sessions.py --store redis://127.0.0.1:6379/0

Starts the fake upstream in this process (`session_agents.PromptWatch`: it keeps each session's
last prompt for the check) and `budgetproxy serve` as bench/soak.py does (disclosed arm,
last_message placement, `history: keep`, trajectories to a temp dir), with Claude Code's
session header as the episode id, its compaction calls free, at most 300 finished episodes
retained and 32 MiB of their turns kept (what retention keeps, bounded by design, reaches those
bounds early).
Runs `--sessions` sessions at once on /v1/messages (session_agents.py: up to `--turns` turns
with a growing history, one compaction mid-way, a share with a small budget that ends at the
refusal), samples the proxy as soak.py does, stops it with SIGTERM, and checks the trajectory
log turn by turn.
Writes soak-sessions-<stamp>.json to --out. Exit status 0 when memory is flat, nothing was
lost, no text was dropped, no prompt broke append-only and no call failed; 1 otherwise.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import datetime as dt
import json
import os
import platform
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import soak  # noqa: E402
import soak_report  # noqa: E402
import targets as tg  # noqa: E402
from session_agents import PromptWatch, SessionLedger, Sessions  # noqa: E402

# Finished episodes are kept for `episodes.retention_s` (a day) by design, under 1 KiB each,
# and their turns for the trajectory API up to `rollouts.max_bytes`: here at most 300 episodes
# and 32 MiB of turns, both reached in the first minutes, so that what the second half measures
# is what does not stay bounded (`budgetproxy serve --check` prints what retention costs).
CONFIG = [
    "budget: {default_turns: 1000000}",
    "episodes: {id_header_presets: [claude_code], compaction_presets: [claude_code], "
    "compaction: free, max_retained: 300}",
    "rollouts: {max_bytes: 33554432}",
]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=15.0, help="length of the load (default 15)")
    p.add_argument("--sessions", type=int, default=8, help="concurrent sessions (default 8)")
    p.add_argument("--turns", type=int, default=200,
                   help="turns a session means to take: from half this to this (default 200)")
    p.add_argument("--small-budget-share", type=float, default=0.1,
                   help="share of sessions created with a budget below their turns, which "
                        "end at the refusal (default 0.1)")
    p.add_argument("--stream-share", type=float, default=0.8,
                   help="share of calls that stream (default 0.8)")
    p.add_argument("--think-ms", type=float, default=50.0,
                   help="mean pause between a session's turns (default 50 ms)")
    p.add_argument("--sample-s", type=float, default=5.0, help="seconds between samples")
    p.add_argument("--progress-s", type=float, default=30.0,
                   help="seconds between progress lines")
    p.add_argument("--warmup-minutes", type=float, default=None,
                   help="excluded from the post-warm-up figures (default: a fifth of the run, "
                        "at most 3 minutes)")
    p.add_argument("--max-slope", type=float, default=4.0,
                   help="MiB/hour of RSS growth over the second half still called flat")
    p.add_argument("--max-excursion", type=float, default=16.0,
                   help="MiB the RSS may peak above its post-warm-up median")
    p.add_argument("--store", default="memory", metavar="memory|redis://HOST:PORT/DB",
                   help="the proxy's episode store (default memory); with a Redis URL the "
                        "soak uses its own key prefix and deletes its keys at the end")
    p.add_argument("--config-line", action="append", default=[], metavar="YAML",
                   help="a further top-level line of the proxy's config, e.g. "
                        "'rollouts: {keep_turns: false}' (repeatable)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=tg.BENCH_DIR / "results")
    p.add_argument("--keep", action="store_true", help="keep the temp dir (logs, trajectories)")
    args = p.parse_args(argv)
    args.retention_s = None  # soak.start_proxy's option: the proxy's own here
    return args


def progress(row: dict[str, Any]) -> str:
    return (f"{row['t_s']:7.0f}s  rss {row['rss_mib']:6.1f} MiB  cpu {row['cpu_pct']:5.1f}%  "
            f"{row.get('calls_per_s', 0):5.1f} calls/s  p99 {row.get('p99_ms')} ms  "
            f"errors {row.get('errors', 0)}  sessions {row.get('sessions_ended', 0)} ended  "
            f"compactions {row.get('compactions', 0)}  prompts {row.get('prompts_checked', 0)}"
            f"  breaks {row.get('append_only_breaks', 0)}  "
            f"dropped {row.get('dropped_texts', 0)}  log {row['trajectory_mib']:.0f} MiB")


def check_records(ledger: SessionLedger, traj: Path) -> dict[str, Any]:
    """Per episode: the ok turn records are turns 1..n, attempt 1, once each, for the n turns
    answered; one compaction record per compaction answered; one rejected record per refusal;
    one episode record with the end reason owed."""
    ok: dict[str, list[tuple[int, int]]] = collections.defaultdict(list)
    compactions: collections.Counter[str] = collections.Counter()
    rejected: collections.Counter[str] = collections.Counter()
    other: collections.Counter[str] = collections.Counter()
    episodes: dict[str, list[str]] = collections.defaultdict(list)
    for r in soak.read_records(traj):
        eid = str(r.get("episode_id"))
        kind = r.get("type")
        if kind == "turn" and r.get("status") == "ok":
            ok[eid].append((int(r.get("turn") or 0), int(r.get("attempt") or 0)))
        elif kind == "turn" and r.get("status") == "rejected":
            rejected[eid] += 1
        elif kind == "turn":
            other[f"{r.get('status')} {r.get('http_status')}"] += 1
        elif kind == "compaction":
            compactions[eid] += 1
        elif kind == "episode":
            episodes[eid].append(str(r.get("end_reason")))
    missing = extra = misnumbered = 0
    examples: list[dict[str, Any]] = []
    for eid in set(ledger.ok_turns) | set(ok):
        want = [(t, 1) for t in range(1, ledger.ok_turns.get(eid, 0) + 1)]
        got = collections.Counter(ok.get(eid, []))
        lost = sum((collections.Counter(want) - got).values())
        more = sum((got - collections.Counter(want)).values())
        missing += max(0, lost - more)
        extra += max(0, more - lost)
        misnumbered += min(lost, more)
        if (lost or more) and len(examples) < 5:
            examples.append({"episode_id": eid, "answered": len(want),
                             "records": sorted(got.elements())[:10]})
    compactions_missing = sum((ledger.compactions - compactions).values())
    compactions_extra = sum((compactions - ledger.compactions).values())
    rejected_off = sum(abs(ledger.rejected[e] - rejected[e])
                       for e in set(ledger.rejected) | set(rejected))
    ended = ledger.ended
    episodes_missing = [e for e in ended if e not in episodes]
    duplicated = [e for e, v in episodes.items() if len(v) > 1]
    wrong = [e for e, want in ended.items() if e in episodes and episodes[e][0] != want]
    good = not (missing or extra or misnumbered or compactions_missing or compactions_extra
                or rejected_off or episodes_missing or duplicated or wrong or other)
    return {
        "ok": good,
        "turns_answered": sum(ledger.ok_turns.values()),
        "turn_records_ok": sum(len(v) for v in ok.values()),
        "turns_missing": missing, "turns_extra": extra, "turns_misnumbered": misnumbered,
        "turn_records_other": dict(other),
        "compactions_answered": sum(ledger.compactions.values()),
        "compaction_records": sum(compactions.values()),
        "compactions_missing": compactions_missing, "compactions_extra": compactions_extra,
        "refusals": sum(ledger.rejected.values()),
        "turn_records_rejected": sum(rejected.values()), "rejected_unmatched": rejected_off,
        "episodes_ended": len(ended), "episode_records": sum(len(v) for v in episodes.values()),
        "episodes_missing": len(episodes_missing), "episodes_duplicated": len(duplicated),
        "episodes_wrong_end_reason": len(wrong),
        "end_reasons": dict(collections.Counter(ended.values())),
        "examples": {"turns": examples, "episodes_missing": episodes_missing[:5],
                     "duplicated": duplicated[:5], "wrong_end_reason": wrong[:5]},
    }


def _heap_note(rss: dict[str, Any]) -> str:
    """The proxy's own reading of its C heap over the second half, when it had one."""
    heap = rss.get("heap_second_half") or {}
    parts = [f"{label} {h['first']:.1f} → {h['last']:.1f} MiB ({h['slope_mib_per_h']:+.1f} ± "
             f"{h['stderr_mib_per_h']} MiB/h)" for label, h in (
                 ("in use", heap.get("heap_in_use_mib")), ("free", heap.get("heap_free_mib")))
             if h is not None]
    return f"; inside, glibc's heap: {', '.join(parts)}" if parts else ""


def verdicts(summary: dict[str, Any], records: dict[str, Any], checks: dict[str, Any],
             errors: int) -> list[tuple[bool, str]]:
    rss = summary["rss"]
    r, c = records, checks
    return [
        (rss["flat"], f"memory flat after warm-up: "
                      f"{rss['slope_second_half_mib_per_h']:+.1f} ± "
                      f"{rss['slope_stderr_mib_per_h']} MiB/h over the second half (limit "
                      f"{rss['max_slope_mib_per_h']:g}), the highest minute "
                      f"{rss['max_minus_median_mib']:.1f} MiB above their median (limit "
                      f"{rss['max_excursion_mib']:g}){_heap_note(rss)}"),
        (r["ok"], f"nothing lost: {r['turn_records_ok']} ok turn records for "
                  f"{r['turns_answered']} answered turns ({r['turns_missing']} missing, "
                  f"{r['turns_extra']} extra, {r['turns_misnumbered']} misnumbered), "
                  f"{r['compaction_records']}/{r['compactions_answered']} compaction records, "
                  f"{r['turn_records_rejected']}/{r['refusals']} refusals logged, "
                  f"{r['episode_records']} episode records for {r['episodes_ended']} ended "
                  f"({r['episodes_missing']} missing, {r['episodes_duplicated']} duplicated, "
                  f"{r['episodes_wrong_end_reason']} wrong end reason)"),
        (not c["dropped_texts"] and not c["duplicated_texts"] and not c["stale_texts"]
         and not c["prompts_unseen"],
         f"budget texts kept: {c['dropped_texts']} dropped, {c['duplicated_texts']} "
         f"duplicated, {c['stale_texts']} stale over {c['prompts_checked']} upstream prompts "
         f"({c['prompts_unseen']} answered calls with no prompt seen upstream)"),
        (not c["append_only_breaks"],
         f"append-only: {c['append_only_breaks']} prompts not extending the previous one "
         f"(compactions aside)"),
        (not c["compactions_told"],
         f"compactions untold: {c['compactions_told']} compaction prompts with a budget text; "
         f"{c['compactions_not_extending']} not extending the previous prompt, "
         f"{c['compaction_prompt_texts']} budget texts in them (forwarded as sent: not a "
         f"failure)"),
        (not errors, f"no failed calls: {errors} errors"),
    ]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    notes = tg.pin_to_client_core("proxy, upstream and sessions")
    revision = soak.git_revision()
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    workdir = Path(tempfile.mkdtemp(prefix="budgetproxy-soak-sessions-"))
    traj = workdir / "trajectories"
    samples_path = args.out / f"soak-sessions-{stamp}-samples.jsonl"
    watch = PromptWatch().start()
    proxy: tg.Target | None = None
    try:
        proxy = soak.start_proxy(workdir, watch.base_url, args,
                                 [*CONFIG, *args.config_line])
        print(f"soak-sessions: {args.minutes:g} min, {args.sessions} concurrent sessions of "
              f"{args.turns // 2}-{args.turns} turns, one compaction each, "
              f"{100 * args.small_budget_share:g}% with a small budget, "
              f"{100 * args.stream_share:g}% streaming; samples to {samples_path}", flush=True)
        load = Sessions(proxy.base_url, watch, slots=args.sessions, turns=args.turns,
                        small_share=args.small_budget_share, stream_share=args.stream_share,
                        think_ms=args.think_ms, seed=args.seed)
        rows = soak.run_loop(soak.sample_while(
            load, args.minutes * 60, args.sample_s, proxy, traj, samples_path,
            print_every_s=args.progress_s, more=load.figures, describe=progress))
        shutdown_s, exit_code = soak.stop_timed(proxy)
    except BaseException:
        print(f"soak failed; logs and config kept in {workdir}", file=sys.stderr)
        raise
    finally:
        if proxy is not None:
            tg.stop(proxy.proc)
        watch.stop()
        if args.store != "memory":
            soak.drop_keys(args.store)
    records = check_records(load.ledger, traj)
    checks = dataclasses.asdict(load.checks)
    warmup_s = 60 * (args.warmup_minutes if args.warmup_minutes is not None
                     else min(3.0, args.minutes / 5))
    summary = soak_report.summarize(rows, load, warmup_s, args.minutes * 60,
                                    args.max_slope, args.max_excursion)
    summary |= {"shutdown_s": round(shutdown_s, 2), "proxy_exit_code": exit_code,
                "sessions_ended": load.sessions_ended,
                "errors_by_kind": dict(load.ledger.errors.most_common(20))}
    judged = verdicts(summary, records, checks, summary["errors"])
    result = {
        "schema": 1, "started_at": stamp, "revision": revision,
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
        | {"warmup_s": warmup_s},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "loadavg": os.getloadavg()},
        "notes": notes, "summary": summary, "records": records, "prompts": checks,
        "verdicts": [f"{line} {'MET' if good else 'MISSED'}" for good, line in judged],
        "samples": rows,
    }
    json_path = args.out / f"soak-sessions-{stamp}.json"
    json_path.write_text(json.dumps(result, indent=2) + "\n")
    rss, lat = summary["rss"], summary["latency_post_warmup"]
    print(f"\nRSS idle / after warm-up / end: {rss['idle_mib']:.1f} / "
          f"{rss['after_warmup_mib']:.1f} / {rss['end_mib']:.1f} MiB (peak HWM "
          f"{rss['peak_hwm_mib']:.1f}); proxy CPU {summary['cpu_pct_post_warmup']:.0f}% of a "
          f"core; calls {summary['calls']} ({summary['streams']} streamed), latency p50 / p99 "
          f"{lat['p50_ms']} / {lat['p99_ms']} ms; sessions begun {load.episodes_started}, "
          f"ended {load.sessions_ended}; shutdown {shutdown_s:.2f} s, exit {exit_code}")
    for line in result["verdicts"]:
        print(line)
    for note in notes:
        print(f"note: {note}")
    print(f"\nresults: {json_path}")
    if args.keep:
        print(f"logs, config and trajectories: {workdir}")
    else:
        with contextlib.suppress(OSError):
            shutil.rmtree(workdir)
    return 0 if all(good for good, _ in judged) else 1


if __name__ == "__main__":
    raise SystemExit(main())
