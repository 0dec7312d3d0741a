"""Benchmark for `budgetproxy analyze`: generate a realistic trajectory log, time the analysis.

    python bench/analyze_bench.py [--turns 10000000] [--files 8] [--keep DIR] [--recovery]
        [--episodes-only] [--memory-limit 1GB]

The log is generated with DuckDB (vectorised, no per-record Python): BudgetMix groups of 8
episodes per task, hidden and disclosed arms, episodes of 10-30 turns cut short by their budget,
tool-call turns with occasional tool errors, one episode record per episode. With
--episodes-only the log holds only the episode records of those episodes (the heaviest case
for memory: every line is kept). Each analysis runs in a child process, so its wall time,
CPU time and peak RSS are its own.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# One row per episode; every value is a deterministic hash of (seed, episode, salt).
EPISODES_SQL = """
CREATE TABLE ep AS
WITH base AS (
    SELECT i, i // 8 AS g, (i // 8) % $tasks AS task,
           30 + 10 * (((i // 8) % $tasks) % 3) AS max_turns
    FROM range($episodes) t(i)
), drawn AS (
    SELECT *,
        (1 + hash($seed, task, g, 'budget') % 10)::BIGINT AS cand,
        CASE WHEN hash($seed, g, 'arm') % 2 = 0 THEN 'hidden' ELSE 'disclosed' END AS arm,
        (10 + hash($seed, i, 'len') % 21)::BIGINT AS length,
        (hash($seed, task, 'difficulty') % 1000) / 1000.0 AS difficulty,
        (hash($seed, i, 'win') % 1000) / 1000.0 AS draw,
        hash($seed, i, 'abandon') % 100 = 0 AS abandoned
    FROM base
), shaped AS (
    SELECT *, greatest(1, (2 * cand * max_turns + 10) // 20) AS budget FROM drawn
), ended AS (
    SELECT *,
        CASE WHEN abandoned THEN least(length, budget) // 2 + 1
             ELSE least(length, budget) END AS turns_used,
        NOT abandoned AND length > budget AS exhausted,
        NOT abandoned AND length <= budget
            AND draw < 0.85 - 0.6 * difficulty + (CASE WHEN arm = 'disclosed' THEN 0.05 ELSE 0 END)
            AS success
    FROM shaped
)
SELECT *, sum(turns_used) OVER (ORDER BY i) AS cum FROM ended
"""

TURN_LINE = """
to_json({
    schema: 1, type: 'turn', episode_id: 'ep-' || i, turn: r.turn, attempt: 1,
    ts: strftime(TIMESTAMP '2026-11-01' + to_seconds(i * 60 + r.turn * 2),
                 '%Y-%m-%dT%H:%M:%S.000Z'),
    latency_s: round(0.2 + (hash(i, r.turn, 'lat') % 2000) / 1000.0, 3),
    model: CASE WHEN task % 2 = 0 THEN 'qwen3-4b' ELSE 'qwen3-4b-grpo' END,
    route: '/v1/chat/completions', stream: false, status: 'ok', http_status: 200,
    request_messages: CASE WHEN r.turn = 1 THEN [
            {role: 'system', content: 'You are a careful SQL agent. Use the tools to answer '
                                      || 'the question.', tool_call_id: NULL, tool_calls: NULL},
            {role: 'user', content: 'Task ' || task || ': list the customers whose orders in '
                 || '2025 exceeded the average order value of their region, ordered by total.',
             tool_call_id: NULL, tool_calls: NULL}]
        ELSE [{role: 'assistant', content: NULL, tool_call_id: NULL,
               tool_calls: [bp_call(i, r.turn - 1, r.prev_args)]},
              {role: 'tool', content: CASE WHEN hash(i, r.turn, 'err') % 10 = 0
                   THEN 'Error: no such column: c' || (hash(i, r.turn) % 9) || '.total'
                   ELSE 'id | name | total' || chr(10) || '17 | Ada | 912.5' || chr(10)
                        || '23 | Lin | 877.0' END,
               tool_call_id: 'call_' || i || '_' || (r.turn - 1), tool_calls: NULL}] END,
    messages_offset: CASE WHEN r.turn = 1 THEN 0 ELSE 2 * r.turn - 1 END,
    response: {content: NULL, tool_calls: [bp_call(i, r.turn, r.args)]},
    finish_reason: 'tool_calls',
    usage: {prompt_tokens: 400 + 120 * r.turn, completion_tokens: 20 + hash(i, r.turn) % 80},
    budget: budget, remaining: budget - r.turn, charged: true,
    disclosure: {arm: arm, text: CASE WHEN arm = 'disclosed' THEN '[Turn budget] Turn ' || r.turn
                 || ' of ' || budget || '. ' || (budget - r.turn) || ' turns remain after this one.'
                 END},
    task_id: 'task-' || task, "group": 'g' || g
})
"""

# The tool call made at turn t, with the arguments of turn a (a repeat when a < t).
CALL_MACRO = """
CREATE MACRO bp_call(i, t, a) AS {
    id: 'call_' || i || '_' || t, type: 'function',
    "function": {name: CASE WHEN hash(i, a, 'tool') % 3 = 0 THEN 'describe' ELSE 'run_sql' END,
                 arguments: '{"query": "SELECT name, total FROM orders WHERE id = '
                            || hash(i, a) % 1000 || '"}'}}
"""

EPISODE_LINE = """
to_json({
    schema: 1, type: 'episode', episode_id: 'ep-' || i, task_id: 'task-' || task,
    "group": 'g' || g, tags: {benchmark: 'intercode-sql', split: 'test'},
    model: CASE WHEN task % 2 = 0 THEN 'qwen3-4b' ELSE 'qwen3-4b-grpo' END,
    budget: budget, max_turns: max_turns,
    tier: ((100 * budget / max_turns / 5)::BIGINT * 5) || '%',
    disclosure: arm, announced_budget: NULL, turns_used: turns_used,
    outcome: CASE WHEN success THEN 'success' WHEN abandoned THEN NULL ELSE 'failure' END,
    success_turn: CASE WHEN success THEN turns_used END,
    reward: CASE WHEN success THEN 1.0 ELSE 0.0 END, exhausted: exhausted,
    end_reason: CASE WHEN success THEN 'success' WHEN abandoned THEN 'abandoned'
                     WHEN exhausted THEN 'exhausted' ELSE 'failure' END,
    started_at: strftime(TIMESTAMP '2026-11-01' + to_seconds(i * 60), '%Y-%m-%dT%H:%M:%S.000Z'),
    ended_at: strftime(TIMESTAMP '2026-11-01' + to_seconds(i * 60 + turns_used * 2 + 1),
                       '%Y-%m-%dT%H:%M:%S.000Z')
})
"""


def generate(
    out: Path, turns: int, files: int, seed: int, episodes_only: bool = False
) -> tuple[int, int]:
    """Write about `turns` turn records (whole episodes) as JSONL files under `out`; with
    `episodes_only`, only those episodes' records."""
    import duckdb

    con = duckdb.connect()
    con.execute("SET enable_progress_bar = false")
    episodes = turns // 15 + 16  # mean episode length is about 17 turns; cut below
    tasks = max(1, min(2000, episodes // 400))
    sql = (
        EPISODES_SQL.replace("$episodes", str(episodes))
        .replace("$tasks", str(tasks))
        .replace("$seed", str(seed))
    )
    con.execute(sql)
    con.execute(f"DELETE FROM ep WHERE cum > {turns}")
    n_turns, n_episodes = con.execute("SELECT sum(turns_used), count(*) FROM ep").fetchone()
    # After a tool error, the next call repeats the failed one 40% of the time.
    con.execute(
        "CREATE MACRO bp_args(i, t) AS CASE WHEN hash(i, t, 'err') % 10 = 0 "
        "AND hash(i, t, 'repeat') % 10 < 4 THEN t - 1 ELSE t END"
    )
    con.execute(CALL_MACRO)
    turn_lines = f"""
            SELECT i, {TURN_LINE} AS line
            FROM ep, (SELECT r.turn, bp_args(i, r.turn) AS args,
                             bp_args(i, r.turn - 1) AS prev_args
                      FROM range(1, turns_used + 1) r(turn)) r
            UNION ALL"""
    lines = f"""
        SELECT i % {files} AS part, line FROM (
            {"" if episodes_only else turn_lines}
            SELECT i, {EPISODE_LINE} AS line FROM ep)
    """
    tmp = out / "_parts"
    con.execute(
        f"COPY ({lines}) TO '{tmp}' (FORMAT csv, HEADER false, QUOTE '', ESCAPE '', "
        f"DELIMITER '\x01', PARTITION_BY (part), OVERWRITE_OR_IGNORE true)"
    )
    for k, path in enumerate(sorted(tmp.rglob("*.csv"))):
        path.rename(out / f"trajectories-{k:03d}.jsonl")
    shutil.rmtree(tmp)
    con.close()
    return int(n_turns), int(n_episodes)


def _peak_rss_mb(pid: int) -> float | None:
    """The process's peak resident set (VmHWM) so far, in MB; None once it has exited."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def run_child(argv: list[str]) -> tuple[int, float, float, float]:
    """Run `budgetproxy analyze ARGV` in a child: (exit code, wall s, CPU s, peak RSS in MB).

    The peak is the child's own VmHWM, polled while it runs: getrusage's maxrss of a child
    would count the pages it shared with this process (and its generator) before exec."""
    t0 = time.perf_counter()
    peak = 0.0
    with open(os.devnull, "w") as sink:
        child = subprocess.Popen(
            [sys.executable, "-m", "budgetproxy", "analyze", *argv], stdout=sink
        )
        while True:
            waited, status, usage = os.wait4(child.pid, os.WNOHANG)
            if waited:
                break
            peak = max(peak, _peak_rss_mb(child.pid) or 0.0)
            time.sleep(0.05)
    child.returncode = os.waitstatus_to_exitcode(status)
    dt = time.perf_counter() - t0
    cpu = usage.ru_utime + usage.ru_stime
    return child.returncode, dt, cpu, peak


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=10_000_000)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", type=Path, help="write the log here and keep it")
    parser.add_argument("--log", type=Path, help="analyse this log instead of generating one")
    parser.add_argument(
        "--recovery", action="store_true", help="also time the recovery view (--error-pattern)"
    )
    parser.add_argument("--parquet", action="store_true", help="also time --to-parquet")
    parser.add_argument(
        "--episodes-only", action="store_true", help="generate only the episode records"
    )
    parser.add_argument("--memory-limit", help="passed to analyze --memory-limit")
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="analyze-bench-"))
    out = args.log or args.keep or workdir / "log"
    try:
        if args.log is None:
            out.mkdir(parents=True, exist_ok=True)
            t0 = time.perf_counter()
            n_turns, n_episodes = generate(
                out, args.turns, args.files, args.seed, args.episodes_only
            )
            if args.episodes_only:
                n_turns = 0
            print(
                f"generated {n_turns:,} turns + {n_episodes:,} episodes "
                f"in {time.perf_counter() - t0:.1f} s",
                file=sys.stderr,
            )
            records = n_turns + n_episodes
        else:
            records = sum(1 for p in out.glob("*.jsonl") for _ in p.open("rb"))
        size = sum(p.stat().st_size for p in out.glob("*.jsonl"))
        print(f"log: {records:,} records, {size / 1e9:.2f} GB in {out}", file=sys.stderr)

        runs: list[tuple[str, list[str]]] = [("pass@(K,T) table", [])]
        if args.recovery:
            runs.append(("table + recovery view", ["--error-pattern", "^Error:"]))
        if args.parquet:
            runs.append(("table + parquet export", ["--to-parquet", str(workdir / "parquet")]))
        limit = ["--memory-limit", args.memory_limit] if args.memory_limit else []
        for label, extra in runs:
            rc, dt, cpu, rss = run_child([str(out), "--json", *limit, *extra])
            print(
                f"{label}: {records:,} records in {dt:.1f} s = {records / dt:,.0f} records/s "
                f"({size / 1e6 / dt:,.0f} MB/s; {cpu:.1f} s CPU on {os.cpu_count()} cores; "
                f"peak RSS {rss:,.0f} MB = {rss * 1e6 / max(size, 1):.2f}x the log; "
                f"load average {os.getloadavg()[0]:.1f}; exit {rc})",
                flush=True,
            )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)  # --keep writes the log outside it
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
