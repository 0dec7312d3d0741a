"""Long episodes: the proxy's CPU per call with an episode against forwarding the same bodies
without one, as the history grows.

An episode's conversation grows by one user and one assistant message a turn (400-character
messages by default; the disclosed arm, last_message placement, `history: keep`, trajectories
and metrics on). For each history length, the episode is played up to that many turns; over
its last `--measured` turns (an episode shorter than that is played again, every turn
measured, until as many calls are) each body is sent twice, with the episode's id and without
any (forwarded untouched), in alternating order, and the proxy process's own CPU time (utime +
stime of every thread, from /proc/PID/task/*/schedstat, nanoseconds) is read around each
call after the proxy has gone quiet. The ratio is the episode calls' CPU over the same
bodies' forwarding CPU, with a 95% bootstrap interval (the calls resampled in their pairs:
the machine's own noise between calls). One run, one proxy per store (memory, and Redis
when redis-server is installed: a private instance on a free port). On Redis, the measured
episode calls' scripts are also read from the server (INFO, before and after): Redis's time
in EVALSHA per call (the turn's open and settle scripts, `redis_us_per_call`) and the bytes
Redis sent per call (their replies, `redis_reply_bytes`).

    python bench/long_episodes.py                       # 10, 50, 200, 400 turns, plus ~400 KB
    python bench/long_episodes.py --turns 10,50 --stores memory

With `--instructions`, the proxy runs under valgrind's callgrind and each row counts the
instructions the proxy executes over the measured calls, the episode's turns as one block and
the same bodies forwarded as another (callgrind's counters zeroed before and dumped after each
block): a ratio the machine's load cannot move (CPU time drifts by 10% and more on a shared
machine). Python runs ~50x slower under callgrind: the default rows take ~10 minutes.

    python bench/long_episodes.py --instructions --measured 10
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
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))

import instructions as ins  # noqa: E402
import targets as tg  # noqa: E402

CONFIG = """\
budget: {{default_turns: 1000000}}
disclosure: {{mode: disclosed, placement: last_message, history: keep}}
server: {{forward_headers: [x-fake-*], max_body_bytes: 67108864}}
{store}
"""
WORDS = ("the test fails because the parser reads one byte past the end of the buffer when "
         "a chunk ends inside a multi-byte character so we keep the tail and retry ").split()


def text(i: int, size: int) -> str:
    """A message of `size` characters, different for every i."""
    out, k = [f"[{i}]"], i
    while sum(len(w) + 1 for w in out) < size:
        out.append(WORDS[k % len(WORDS)])
        k = k * 7 + 3
    return " ".join(out)[:size]


ROUTES = {"chat": "/v1/chat/completions", "messages": "/v1/messages"}
ROUTE = ROUTES["chat"]  # the API the bodies are for (--api)
_CACHE = {"type": "ephemeral"}
# Claude Code's tools, in size: about 20 KB of schemas sent with every call
_TOOLS = [{"name": f"Tool{i}", "description": text(1000 + i, 800),
           "input_schema": {"type": "object", "properties": {
               "command": {"type": "string", "description": text(2000 + i, 120)},
               "timeout": {"type": "number", "maximum": 600000}}, "required": ["command"]}}
          for i in range(20)]


def bodies(turns: int, size: int) -> list[bytes]:
    """The body of each turn, for the API of ROUTE."""
    return messages_bodies(turns, size) if ROUTE == ROUTES["messages"] else chat_bodies(
        turns, size)


def chat_bodies(turns: int, size: int) -> list[bytes]:
    """The chat body of each turn: a system prompt, then turn-many user messages with the
    assistant's replies between them."""
    messages: list[dict[str, str]] = [{"role": "system", "content": text(0, size)}]
    out = []
    for t in range(1, turns + 1):
        messages.append({"role": "user", "content": text(2 * t, size)})
        out.append(orjson.dumps({"model": "m1", "max_tokens": 16, "messages": messages}))
        messages.append({"role": "assistant", "content": text(2 * t + 1, size)})
    return out


def messages_bodies(turns: int, size: int) -> list[bytes]:
    """A Claude Code session's Messages bodies: the system prompt as a marked text block and
    the tools on every call; the first prompt a string on the first call and a marked text
    block from the second on; each turn an assistant reply of text and a tool call, and the
    tool's result as the next user message, the newest block marked (`cache_control`)."""
    system = [{"type": "text", "text": text(0, size), "cache_control": _CACHE}]
    history: list[dict[str, Any]] = [{"role": "user", "content": text(1, size)}]
    out = []
    for t in range(1, turns + 1):
        wire = list(history)
        if t > 1:
            wire[0] = {"role": "user", "content": [
                {"type": "text", "text": history[0]["content"], "cache_control": _CACHE}]}
            last = wire[-1]
            wire[-1] = {"role": "user", "content": [
                {**last["content"][0], "cache_control": _CACHE}]}
        out.append(orjson.dumps({"model": "m1", "max_tokens": 32000, "system": system,
                                 "tools": _TOOLS, "messages": wire}))
        history.append({"role": "assistant", "content": [
            {"type": "text", "text": text(3 * t, size // 4)},
            {"type": "tool_use", "id": f"toolu_{t:04d}", "name": "Tool0",
             "input": {"command": text(3 * t + 1, 60)}}]})
        history.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": f"toolu_{t:04d}",
             "content": text(3 * t + 2, size)}]})
    return out


def cpu_ns(pid: int) -> int:
    """CPU time of every thread of `pid`, in nanoseconds."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return total


def measured_call(client: httpx.Client, pid: int, body: bytes, headers: dict[str, str],
                  settle_s: float) -> int:
    """The proxy's CPU for one call: read before, and once its work after the answer (the
    record, the settle) has had time to run."""
    before = cpu_ns(pid)
    r = client.post(ROUTE, content=body, headers=headers)
    if r.status_code != 200:
        raise SystemExit(f"HTTP {r.status_code}: {r.text[:300]}")
    time.sleep(settle_s)
    return cpu_ns(pid) - before


def redis_counters(client: Any) -> tuple[int, int, int]:
    """(EVALSHA calls, their microseconds, bytes sent to clients) as the server counts them."""
    evalsha = client.info("commandstats").get("cmdstat_evalsha", {})
    sent = client.info("stats")["total_net_output_bytes"]
    return int(evalsha.get("calls", 0)), int(evalsha.get("usec", 0)), int(sent)


def counted_block(client: httpx.Client, pid: int, prefix: Path, bodies_: list[bytes],
                  headers: dict[str, str], settle_s: float) -> int:
    """Instructions the proxy (under callgrind, writing to `prefix`) executes over these
    calls and the work they leave behind (the record, the settle)."""
    ins.callgrind_control(pid, "-z")
    for body in bodies_:
        r = client.post(ROUTE, content=body, headers=headers)
        if r.status_code != 200:
            raise SystemExit(f"HTTP {r.status_code}: {r.text[:300]}")
    time.sleep(settle_s)
    ins.callgrind_control(pid, "-d")
    time.sleep(0.5)
    return ins.dumped_events(prefix)["Ir"]


def warm_up(client: httpx.Client, store: str) -> None:
    """One short episode and the same bodies forwarded, not measured: what a proxy does once
    (its store's scripts loaded, connections opened, code first run) is no turn's cost."""
    plain = {"content-type": "application/json"}
    episode = {**plain, "X-Episode-Id": f"warm-{store}-{time.time_ns()}"}
    for body in bodies(5, 400):
        for headers in (episode, plain):
            r = client.post(ROUTE, content=body, headers=headers)
            if r.status_code != 200:
                raise SystemExit(f"HTTP {r.status_code}: {r.text[:300]}")


def run_store_counted(store: str, url: str, pid: int, prefix: Path,
                      rows: list[tuple[int, int]], measured: int) -> list[dict[str, Any]]:
    """run_store's rows, in instructions (--instructions)."""
    out = []
    with httpx.Client(base_url=url, timeout=600.0) as client:
        warm_up(client, store)
        plain = {"content-type": "application/json"}
        for n, (turns, size) in enumerate(rows):
            episode = {**plain, "X-Episode-Id": f"long-{store}-{n}-{time.time_ns()}"}
            seq = bodies(turns, size)
            for body in seq[:turns - measured]:  # growing the episode to its length
                r = client.post(ROUTE, content=body, headers=episode)
                if r.status_code != 200:
                    raise SystemExit(f"HTTP {r.status_code}: {r.text[:300]}")
            last = seq[turns - measured:]
            ep = counted_block(client, pid, prefix, last, episode, 2.0)
            fwd = counted_block(client, pid, prefix, last, plain, 2.0)
            calls = len(last)
            row = {"store": store, "turns": turns, "message_chars": size,
                   "last_body_bytes": len(seq[-1]), "calls": calls,
                   "episode_instructions_per_call": round(ep / calls),
                   "forward_instructions_per_call": round(fwd / calls),
                   "ratio": round(ep / fwd, 3)}
            print(f"{store:7} {turns:4} turns  {len(seq[-1]) / 1000:7.0f} KB  episode "
                  f"{ep / calls / 1e6:8.2f}M instr  forwarding {fwd / calls / 1e6:8.2f}M instr"
                  f"  {row['ratio']}x", flush=True)
            out.append(row)
    return out


def ratio_interval(ep: list[int], fwd: list[int], draws: int = 2000,
                   seed: int = 0) -> tuple[float, float]:
    """A 95% bootstrap interval of sum(ep) / sum(fwd), the calls resampled in their pairs
    (each episode call with its body's forwarding)."""
    rnd = random.Random(seed)
    n = len(ep)
    ratios = []
    for _ in range(draws):
        picks = [rnd.randrange(n) for _ in range(n)]
        ratios.append(sum(ep[i] for i in picks) / max(1, sum(fwd[i] for i in picks)))
    ratios.sort()
    return ratios[int(0.025 * draws)], ratios[int(0.975 * draws) - 1]


TARGETS = {"memory": 1.5, "redis": 2.0}  # the bar: CPU per call against forwarding's
GROWTH_LIMIT = 1.2  # the longest history's ratio within this of the shortest's


def judged(ratio: float, low: float, high: float, target: float) -> str:
    """A row against its target, by its interval: under, over, or not told apart."""
    if high <= target:
        return "MET"
    if low > target:
        return "MISSED"
    return f"UNDECIDED (its interval holds {target}x)"


def verdict(rows: list[dict[str, Any]]) -> list[str]:
    """Each CPU row against its store's target, and per store whether the ratio grows with
    the history: the longest row's over the shortest's (of the 400-character rows), with the
    bounds the two rows' intervals allow (an interval of the quotient no narrower than that)."""
    lines = []
    for store in dict.fromkeys(r["store"] for r in rows):
        mine = [r for r in rows if r["store"] == store and r.get("ratio") is not None
                and "ratio_95" in r]
        target = TARGETS.get(store)
        if not mine or target is None:
            continue
        for r in mine:
            low, high = r["ratio_95"]
            lines.append(f"{store:7} {r['turns']:4} turns {r['message_chars']:5} chars  "
                         f"{r['ratio']:.2f}x [{low:.2f}, {high:.2f}] against {target}x: "
                         f"{judged(r['ratio'], low, high, target)}")
        plain = sorted((r for r in mine if r["message_chars"] == mine[0]["message_chars"]),
                       key=lambda r: r["turns"])
        if len(plain) > 1:
            first, last = plain[0], plain[-1]
            growth = last["ratio"] / first["ratio"]
            low = last["ratio_95"][0] / first["ratio_95"][1]
            high = last["ratio_95"][1] / first["ratio_95"][0]
            state = ("MET" if high <= GROWTH_LIMIT else "MISSED" if low > GROWTH_LIMIT
                     else f"UNDECIDED (its bounds hold {GROWTH_LIMIT})")
            lines.append(f"{store:7} growth {last['turns']} against {first['turns']} turns: "
                         f"{growth:.2f} [{low:.2f}, {high:.2f}] against {GROWTH_LIMIT}: {state}")
    return lines


def run_store(store: str, url: str, pid: int, rows: list[tuple[int, int]], measured: int,
              settle_s: float, redis_url: str | None = None) -> list[dict[str, Any]]:
    out = []
    server = None
    if redis_url is not None:
        import redis

        server = redis.Redis.from_url(redis_url)
        # what reading the counters itself sends (the two INFO replies), taken off below
        first = redis_counters(server)[2]
        info_bytes = redis_counters(server)[2] - first
    with httpx.Client(base_url=url, timeout=60.0) as client:
        warm_up(client, store)
        plain = {"content-type": "application/json"}
        for n, (turns, size) in enumerate(rows):
            seq = bodies(turns, size)
            ep_ns: list[int] = []
            fwd_ns: list[int] = []
            evalsha = [0, 0, 0]
            # An episode shorter than --measured is played again (a new one each time), every
            # turn measured, until as many calls are; a longer one is grown to its length and
            # its last --measured turns are.
            episodes = max(1, -(-measured // turns))
            for k in range(episodes):
                episode = {**plain, "X-Episode-Id": f"long-{store}-{n}-{k}-{time.time_ns()}"}
                for t, body in enumerate(seq, 1):
                    if t <= turns - measured:  # growing the episode to its length
                        r = client.post(ROUTE, content=body, headers=episode)
                        if r.status_code != 200:
                            raise SystemExit(f"HTTP {r.status_code}: {r.text[:300]}")
                        continue
                    pair = [(episode, True), (plain, False)]
                    if (t + k) % 2:
                        pair.reverse()
                    for headers, is_episode in pair:
                        before = redis_counters(server) if server and is_episode else None
                        ns = measured_call(client, pid, body, headers, settle_s)
                        (ep_ns if is_episode else fwd_ns).append(ns)
                        if before is not None and server is not None:
                            after = redis_counters(server)
                            for i in range(3):
                                evalsha[i] += after[i] - before[i]
            calls = len(ep_ns)
            low, high = ratio_interval(ep_ns, fwd_ns)
            row = {"store": store, "turns": turns, "message_chars": size,
                   "last_body_bytes": len(seq[-1]), "calls": calls, "episodes": episodes,
                   "episode_us_per_call": round(sum(ep_ns) / calls / 1000, 1),
                   "forward_us_per_call": round(sum(fwd_ns) / calls / 1000, 1),
                   "ratio": round(sum(ep_ns) / sum(fwd_ns), 3) if sum(fwd_ns) else None,
                   "ratio_95": [round(low, 3), round(high, 3)]}
            extra = ""
            if server is not None:
                row["evalsha_per_call"] = round(evalsha[0] / calls, 2)
                row["redis_us_per_call"] = round(evalsha[1] / calls, 1)
                row["redis_reply_bytes"] = round((evalsha[2] - calls * info_bytes) / calls)
                extra = (f"  redis {row['redis_us_per_call']:6.1f} us "
                         f"{row['redis_reply_bytes']:6} B")
            print(f"{store:7} {turns:4} turns  {len(seq[-1]) / 1000:7.0f} KB  episode "
                  f"{row['episode_us_per_call']:8.1f} us  forwarding "
                  f"{row['forward_us_per_call']:8.1f} us  {row['ratio']}x "
                  f"[{low:.2f}, {high:.2f}] over {calls} calls{extra}", flush=True)
            out.append(row)
    if server is not None:
        server.close()
    return out


def start_redis(workdir: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = tg.free_port()
    proc = tg.spawn(["redis-server", "--port", str(port), "--save", "", "--appendonly", "no",
                     "--bind", "127.0.0.1"], workdir / "redis.log", core=tg.CLIENT_CORE)
    for _ in range(100):
        done = subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True,
                              text=True, check=False)
        if done.stdout.strip() == "PONG":
            return proc, f"redis://127.0.0.1:{port}/0"
        time.sleep(0.1)
    raise SystemExit("redis-server did not start")


def start_proxy(workdir: Path, upstream: str, store: str, counted: bool = False,
                repo: Path | None = None) -> tuple[subprocess.Popen[bytes], str]:
    """A proxy of CONFIG on a free port, from this checkout or the one at `repo`."""
    port = tg.free_port()
    config = workdir / f"proxy-{port}.yaml"
    config.write_text(CONFIG.format(store=f"store: {{kind: redis, url: '{store}'}}"
                                    if store.startswith("redis") else ""))
    argv = [sys.executable, "-m", "budgetproxy", "serve", "--port", str(port), "--config",
            str(config), "--upstream", upstream, "--log-dir", str(workdir / f"traj-{port}")]
    if counted:
        argv = ["valgrind", "--tool=callgrind", "--cache-sim=no",
                f"--callgrind-out-file={workdir / 'proxy.callgrind'}", *argv]
    proc = tg.spawn(argv, workdir / f"proxy-{port}.log", {"PYTHONPATH": str(repo or tg.REPO_DIR)},
                    cwd=workdir)
    target = tg.Target("budgetproxy", "", f"http://127.0.0.1:{port}/v1", proc=proc)
    if not tg.wait_ready(target, 300 if counted else 60):
        raise SystemExit(f"proxy did not start: {target.skip}")
    return proc, f"http://127.0.0.1:{port}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--turns", default="10,50,200,400", help="history lengths (turns)")
    p.add_argument("--message-chars", type=int, default=400)
    p.add_argument("--large", default="50:4000",
                   help="one more row TURNS:CHARS with large contexts (~400 KB); '' for none")
    p.add_argument("--measured", type=int, default=20, help="calls measured per length")
    p.add_argument("--settle-ms", type=float, default=15.0,
                   help="wait after each measured call before reading the proxy's CPU")
    p.add_argument("--stores", default="memory,redis")
    p.add_argument("--api", choices=sorted(ROUTES), default="chat",
                   help="chat bodies, or a Claude Code session's Messages bodies")
    p.add_argument("--instructions", action="store_true",
                   help="count the proxy's instructions under callgrind instead of CPU time")
    args = p.parse_args()
    if args.instructions and shutil.which("callgrind_control") is None:
        raise SystemExit("--instructions needs valgrind (Debian: apt-get install valgrind)")
    global ROUTE
    ROUTE = ROUTES[args.api]
    rows = [(int(t), args.message_chars) for t in args.turns.split(",") if t]
    if args.large:
        t, _, c = args.large.partition(":")
        rows.append((int(t), int(c)))
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bp-long-") as tmp:
        workdir = Path(tmp)
        upstream = tg.start_upstream(workdir, 4, 0.0)
        procs: list[subprocess.Popen[bytes] | None] = [upstream.proc]
        try:
            for store in args.stores.split(","):
                url, redis_url = "memory", None
                if store == "redis":
                    if shutil.which("redis-server") is None:
                        print("redis: skipped (redis-server not installed)")
                        continue
                    redis, url = start_redis(workdir)
                    redis_url = url
                    procs.append(redis)
                proxy, base = start_proxy(workdir, upstream.base_url, url, args.instructions)
                procs.append(proxy)
                if args.instructions:
                    results += run_store_counted(store, base, proxy.pid,
                                                 workdir / "proxy.callgrind", rows,
                                                 args.measured)
                    tg.stop(proxy)
                    for old in workdir.glob("proxy.callgrind*"):
                        old.unlink()  # (the next store's dumps are read by the same name)
                    continue
                results += run_store(store, base, proxy.pid, rows, args.measured,
                                     args.settle_ms / 1000, redis_url)
                tg.stop(proxy)
        finally:
            for proc in procs:
                tg.stop(proc)
    judgement = [] if args.instructions else verdict(results)
    if judgement:
        print("verdict (a row's 95% interval against the target):")
        for line in judgement:
            print(f"  {line}")
    out = tg.REPO_DIR / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"long-episodes-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"
    path.write_text(json.dumps({"args": vars(args), "rows": results, "verdict": judgement},
                               indent=1))
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
