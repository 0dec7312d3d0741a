"""What each part of an episode call costs: `long_episodes.py`'s ratio (the proxy's CPU per
episode call against forwarding the same body without one) for its configuration and for the
same configuration with one part turned off, side by side.

One proxy per configuration, all on the same core, in front of one upstream; every body of
the episodes is sent to each proxy with the episode's id and without any, the calls in a new
random order for each body, and each proxy's own CPU time is read around each call once it has
gone quiet (as in long_episodes.py). Each configuration's ratio carries a 95% bootstrap
interval, and so does its difference from the first one (the calls resampled in their pairs,
the same draws for both: the machine's noise between calls, which a side-by-side run shares).

    python bench/long_episode_parts.py                          # 10-turn chat episodes
    python bench/long_episode_parts.py --api messages --turns 50
    python bench/long_episode_parts.py --part 'no budget headers=budget: {headers: never}'

With `--revision NAME=REV`, a proxy of the benched configuration runs from the git revision
REV (its package unpacked with `git archive`, as bench/run.py's `@REV` rows; or a checkout's
directory) beside this one's: what a change costs.

    python bench/long_episode_parts.py --revision before=HEAD~3 --measured 1200
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

import long_episodes as le  # noqa: E402
import targets as tg  # noqa: E402

PARTS = {
    "hidden arm (no texts placed)": "disclosure: {mode: hidden}",
    "no trajectory log": "trajectories: {enabled: false}",
    "no turn log (trajectory API)": "rollouts: {keep_turns: false}",
    "no metrics": "metrics: {enabled: false}",
}


def interval(values: list[float]) -> tuple[float, float]:
    values = sorted(values)
    return values[int(0.025 * len(values))], values[int(0.975 * len(values)) - 1]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--turns", type=int, default=10, help="turns an episode is played to")
    p.add_argument("--measured", type=int, default=200, help="calls measured per proxy")
    p.add_argument("--message-chars", type=int, default=400)
    p.add_argument("--api", choices=sorted(le.ROUTES), default="chat")
    p.add_argument("--store", choices=("memory", "redis"), default="memory")
    p.add_argument("--part", action="append", default=[], metavar="NAME=YAML",
                   help="a configuration to compare (YAML added to long_episodes.py's); "
                   "default: the hidden arm, no trajectory log, no turn log, no metrics")
    p.add_argument("--revision", action="append", default=[], metavar="NAME=REV",
                   help="the benched configuration run from git revision REV (or a checkout)")
    p.add_argument("--settle-ms", type=float, default=15.0)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    le.ROUTE = le.ROUTES[args.api]
    if any("=" not in r for r in args.revision):
        raise SystemExit("--revision takes NAME=REV (a git revision, or a checkout's directory)")
    revisions = dict(r.split("=", 1) for r in args.revision)
    parts = dict(part.split("=", 1) for part in args.part) if args.part or revisions else PARTS
    configs = {"as benched (long_episodes.py)": "", **parts, **dict.fromkeys(revisions, "")}
    rnd = random.Random(args.seed)
    base_config = le.CONFIG
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bp-parts-") as tmp:
        workdir = Path(tmp)
        upstream = tg.start_upstream(workdir, 4, 0.0)
        procs: list[subprocess.Popen[bytes] | None] = [upstream.proc]
        try:
            store = "memory"
            if args.store == "redis":
                if shutil.which("redis-server") is None:
                    raise SystemExit("redis-server is not installed")
                redis, store = le.start_redis(workdir)
                procs.append(redis)
            sources = {name: Path(rev) if (Path(rev) / "budgetproxy").is_dir()
                       else tg.source_of(rev, workdir) for name, rev in revisions.items()}
            proxies = {}
            for name, extra in configs.items():
                le.CONFIG = base_config + extra.replace("{", "{{").replace("}", "}}") + "\n"
                proc, url = le.start_proxy(workdir, upstream.base_url, store,
                                           repo=sources.get(name))
                procs.append(proc)
                client = httpx.Client(base_url=url, timeout=60.0)
                le.warm_up(client, "parts")
                proxies[name] = (proc, client)
            seq = le.bodies(args.turns, args.message_chars)
            plain = {"content-type": "application/json"}
            ep: dict[str, list[int]] = {n: [] for n in proxies}
            fwd: dict[str, list[int]] = {n: [] for n in proxies}
            measured, k = 0, 0
            first = max(0, args.turns - args.measured)  # a long episode: its last turns
            print(f"{len(proxies)} proxies, {args.api} episodes of {args.turns} turns, "
                  f"{args.store} store, {args.measured} calls each", flush=True)
            while measured < args.measured:
                ids = {n: {**plain, "X-Episode-Id": f"parts-{i}-{k}-{time.time_ns()}"}
                       for i, n in enumerate(proxies)}
                for t, body in enumerate(seq):
                    order = [(n, e) for n in proxies for e in (True, False)]
                    rnd.shuffle(order)
                    for name, is_episode in order:
                        if t < first and not is_episode:
                            continue
                        proc, client = proxies[name]
                        ns = le.measured_call(client, proc.pid, body,
                                              ids[name] if is_episode else plain,
                                              args.settle_ms / 1000)
                        if t >= first:
                            (ep if is_episode else fwd)[name].append(ns)
                    if t >= first:
                        measured += 1
                        if measured >= args.measured:
                            break
                k += 1
            for _, client in proxies.values():
                client.close()
        finally:
            for proc in procs:
                tg.stop(proc)
    n = len(next(iter(ep.values())))
    draws = [[rnd.randrange(n) for _ in range(n)] for _ in range(2000)]

    def ratio(name: str, idx: Any) -> float:
        return sum(ep[name][i] for i in idx) / max(1, sum(fwd[name][i] for i in idx))

    base = next(iter(configs))
    base_draws = [ratio(base, d) for d in draws]
    for name in configs:
        r = ratio(name, range(n))
        low, high = interval([ratio(name, d) for d in draws])
        row: dict[str, Any] = {"config": configs[name], "ratio": round(r, 3),
                               "ratio_95": [round(low, 3), round(high, 3)],
                               "episode_us_per_call": round(sum(ep[name]) / n / 1000, 1),
                               "forward_us_per_call": round(sum(fwd[name]) / n / 1000, 1)}
        line = f"{name:32} {r:.3f}x [{low:.3f}, {high:.3f}]"
        if name != base:
            d = r - ratio(base, range(n))
            dlow, dhigh = interval([ratio(name, dd) - b for dd, b in zip(draws, base_draws,
                                                                           strict=True)])
            row["difference"] = round(d, 3)
            row["difference_95"] = [round(dlow, 3), round(dhigh, 3)]
            line += f"   {d:+.3f} [{dlow:+.3f}, {dhigh:+.3f}]"
        print(line)
        results[name] = row
    out = tg.REPO_DIR / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"long-episode-parts-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"
    path.write_text(json.dumps({"args": vars(args), "calls": n, "rows": results}, indent=1))
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
