"""Reading trajectory logs (JSONL, .jsonl.gz, Parquet) into DuckDB, counting what is skipped.

Episode records become the temp table `episodes`: validated, typed, one row per episode_id
(of several records the last wins: latest ended_at, then later file); `turn_episodes` counts
turn records per episode. Turn records themselves stay in the files: `create_turns_view`
defines views that re-read them for the recovery view and the Parquet export, so they never
become Python objects.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from budgetproxy.analysis import parquet
from budgetproxy.analysis.db import InputError, connect, sql_list, sql_str
from budgetproxy.analysis.progress import Progress
from budgetproxy.trajectories.records import SCHEMA_VERSION

__all__ = [
    "EPISODE_FIELDS", "TURN_COLUMNS", "InputError", "Inputs", "ScanSummary", "connect",
    "create_turns_view", "discover", "load_episodes", "sql_list", "sql_str",
]  # fmt: skip

LOG_SUFFIXES = (".jsonl", ".jsonl.gz", ".parquet")
MAX_LINE_BYTES = 1 << 30  # a turn record can carry a whole file in a tool result

# Episode fields read from each record; all arrive as text and are validated in SQL.
EPISODE_FIELDS = (
    "episode_id", "task_id", "group", "tags", "model", "budget", "max_turns", "tier",
    "disclosure", "announced_budget", "turns_used", "outcome", "success_turn", "reward",
    "exhausted", "end_reason", "started_at", "ended_at",
)  # fmt: skip

TURN_COLUMNS = {
    "episode_id": "VARCHAR", "turn": "BIGINT", "attempt": "BIGINT", "ts": "VARCHAR",
    "latency_s": "DOUBLE", "model": "VARCHAR", "route": "VARCHAR", "stream": "BOOLEAN",
    "status": "VARCHAR", "http_status": "BIGINT", "request_messages": "JSON",
    "messages_offset": "BIGINT", "response": "JSON", "finish_reason": "VARCHAR",
    "usage": "JSON", "budget": "BIGINT", "remaining": "BIGINT", "charged": "BOOLEAN",
    "disclosure": "JSON", "task_id": "VARCHAR", "group": "VARCHAR",
    "previous_response_id": "VARCHAR",
}  # fmt: skip


@dataclass(frozen=True)
class Inputs:
    """The log files found under the paths given, in a stable order."""

    jsonl: list[str]
    parquet: list[str]
    total_bytes: int

    @property
    def files(self) -> int:
        return len(self.jsonl) + len(self.parquet)


@dataclass
class ScanSummary:
    """What reading the logs found and what it skipped."""

    files: int = 0
    bytes: int = 0
    turn_records: int = 0
    episode_records: int = 0
    episodes: int = 0
    duplicates: int = 0
    skipped: int = 0
    # (reason, count, an example "file: first characters of the line"), most frequent first
    reasons: list[tuple[str, int, str]] = field(default_factory=list)
    # files that could not be read at all (a truncated .gz, a broken Parquet file): (file, why)
    unreadable: list[tuple[str, str]] = field(default_factory=list)
    # the inputs without the unreadable files, for later passes over the turns
    readable: Inputs = field(default_factory=lambda: Inputs([], [], 0))


def discover(paths: Sequence[str]) -> Inputs:
    """Files given directly, and *.jsonl, *.jsonl.gz, *.parquet found under folders."""
    found: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found.extend(
                sorted(p for p in path.rglob("*") if p.is_file() and p.name.endswith(LOG_SUFFIXES))
            )
        elif path.is_file():
            found.append(path)
        else:
            raise InputError(f"no such file or directory: {raw}", exit_code=2)
    seen: set[Path] = set()
    jsonl: list[str] = []
    parquet: list[str] = []
    total = 0
    for path in found:
        key = path.resolve()
        if key in seen:
            continue
        seen.add(key)
        total += path.stat().st_size
        (parquet if path.name.endswith(".parquet") else jsonl).append(str(path))
    return Inputs(jsonl=jsonl, parquet=parquet, total_bytes=total)


def _read_lines(files: Sequence[str]) -> str:
    # Each line as one VARCHAR: \x01 never occurs unescaped in JSON text, and no quoting.
    return (
        f"read_csv({sql_list(files)}, columns = {{'line': 'VARCHAR'}}, header = false, "
        f"delim = '\x01', quote = '', escape = '', filename = true, auto_detect = false, "
        f"max_line_size = {MAX_LINE_BYTES}, strict_mode = false, null_padding = true)"
    )


# One pass over every line, parsed once for its schema, type and episode_id. Episode lines are
# kept for the next step; turn lines only counted, per file and episode; probe lines passed over
# (they belong to no episode); anything else grouped by the reason it is skipped.
SCAN_SQL = """
CREATE TEMP TABLE scan AS
WITH head AS (
    SELECT filename AS file, line,
        CASE WHEN line IS NOT NULL
             THEN try(json_extract_string(line, ['$.schema', '$.type', '$.episode_id'])) END
            AS h
    FROM {lines}
), kinded AS (
    -- CASE evaluates a branch only for the rows that reach it: trim() runs on bad lines only
    SELECT file, line, h,
        CASE WHEN line IS NULL THEN 'blank'
             WHEN h IS NULL THEN (CASE WHEN trim(line) = '' THEN 'blank' ELSE 'bad' END)
             WHEN h[2] = 'episode' THEN 'episode'
             WHEN h[1] = '{schema}' AND h[2] = 'turn' AND h[3] IS NOT NULL THEN 'turn'
             -- a probe's calls (budgetproxy probe) belong to no episode: not read, not bad
             WHEN h[1] = '{schema}' AND h[2] = 'probe' THEN 'probe'
             ELSE 'bad' END AS kind
    FROM head
)
SELECT file, kind,
    CASE WHEN kind <> 'bad' THEN NULL
         WHEN h IS NULL THEN 'not valid JSON (truncated line?)'
         WHEN h[1] IS NULL THEN 'no "schema" field'
         WHEN h[1] <> '{schema}' THEN 'unknown schema version ' || h[1]
         WHEN h[2] IS NULL THEN 'no "type" field'
         WHEN h[2] = 'turn' THEN 'turn record without episode_id'
         ELSE 'unknown record type ' || h[2] END AS reason,
    CASE WHEN kind = 'episode' THEN line END AS line,
    CASE WHEN kind = 'turn' THEN h[3] END AS episode_id,
    count(*) AS n, min(CASE WHEN kind = 'bad' THEN left(line, 100) END) AS sample
FROM kinded GROUP BY ALL
"""

RAW_EPISODES_SQL = """
CREATE TEMP TABLE raw_episodes AS
SELECT file, n, left(line, 100) AS sample, v IS NULL AS unparsable, {columns}
FROM (SELECT file, n, line, try(json_extract_string(line, {paths})) AS v
      FROM scan WHERE kind = 'episode')
"""

INT_MACRO = """
CREATE OR REPLACE TEMP MACRO bp_int(s) AS
    CASE WHEN TRY_CAST(s AS DOUBLE) = floor(TRY_CAST(s AS DOUBLE))
          AND abs(TRY_CAST(s AS DOUBLE)) < 1e15
         THEN TRY_CAST(TRY_CAST(s AS DOUBLE) AS BIGINT) END
"""

# Validation in one CASE: the first problem found is the reason the record is skipped.
CHECKED_SQL = """
CREATE TEMP TABLE checked AS
SELECT *,
    CASE WHEN unparsable THEN 'not valid JSON (truncated line?)'
         WHEN schema IS NULL THEN 'no "schema" field'
         WHEN TRY_CAST(schema AS DOUBLE) IS DISTINCT FROM {schema}
            THEN 'unknown schema version ' || schema
         WHEN type IS NULL THEN 'no "type" field'
         WHEN type <> 'episode' THEN 'unknown record type ' || type
         WHEN episode_id IS NULL THEN 'episode record without episode_id'
         WHEN bp_int(budget) IS NULL OR bp_int(budget) < 1 THEN 'episode: missing or invalid budget'
         WHEN disclosure IS NULL OR disclosure NOT IN ('hidden', 'disclosed')
            THEN 'episode: missing or unknown disclosure arm'
         WHEN end_reason IS NULL
              OR end_reason NOT IN ('success', 'failure', 'exhausted', 'abandoned')
            THEN 'episode: missing or unknown end_reason'
         WHEN bp_int(turns_used) IS NULL OR bp_int(turns_used) < 0
            THEN 'episode: missing or invalid turns_used'
         WHEN max_turns IS NOT NULL AND coalesce(bp_int(max_turns), 0) < 1
            THEN 'episode: invalid max_turns'
         WHEN announced_budget IS NOT NULL AND coalesce(bp_int(announced_budget), 0) < 1
            THEN 'episode: invalid announced_budget'
         WHEN success_turn IS NOT NULL AND coalesce(bp_int(success_turn), 0) < 1
            THEN 'episode: invalid success_turn'
         WHEN outcome IS NOT NULL AND outcome NOT IN ('success', 'failure')
            THEN 'episode: unknown outcome'
    END AS problem
FROM raw_episodes
"""

EPISODES_SQL = """
CREATE TEMP TABLE episodes AS
WITH typed AS (
    SELECT file, episode_id, task_id, "group",
        CASE WHEN json_valid(tags) AND json_type(tags) = 'OBJECT' THEN tags::JSON END AS tags,
        model, bp_int(budget) AS budget, bp_int(max_turns) AS max_turns, tier, disclosure,
        bp_int(announced_budget) AS announced_budget, bp_int(turns_used) AS turns_used,
        outcome, bp_int(success_turn) AS recorded_success_turn,
        TRY_CAST(reward AS DOUBLE) AS reward, TRY_CAST(exhausted AS BOOLEAN) AS exhausted,
        end_reason, TRY_CAST(started_at AS TIMESTAMPTZ) AS started_at,
        TRY_CAST(ended_at AS TIMESTAMPTZ) AS ended_at, sample,
        outcome = 'success' OR end_reason = 'success' AS success
    FROM checked WHERE problem IS NULL
)
SELECT * EXCLUDE (sample, success),
    coalesce(success, false) AS success,
    -- success_turn defaults to the turns used, as the outcome endpoint does
    CASE WHEN success THEN coalesce(recorded_success_turn, turns_used) END AS success_turn
FROM typed
QUALIFY row_number() OVER (
    PARTITION BY episode_id ORDER BY ended_at DESC NULLS LAST, file DESC, sample DESC) = 1
"""


def load_episodes(con: Any, inputs: Inputs, progress: Progress) -> ScanSummary:
    """Read every log file once; leave the temp table `episodes`; return the counts."""
    con.execute(INT_MACRO)
    paths = sql_list(["$." + name for name in ("schema", "type", *EPISODE_FIELDS)])
    columns = ", ".join(
        f'v[{i + 1}] AS "{name}"' for i, name in enumerate(("schema", "type", *EPISODE_FIELDS))
    )
    unreadable: list[tuple[str, str]] = []
    jsonl = _scan_jsonl(con, list(inputs.jsonl), progress, unreadable)
    con.execute(RAW_EPISODES_SQL.format(columns=columns, paths=paths))
    con.execute(
        "CREATE TEMP TABLE turn_episodes AS SELECT episode_id, sum(n)::BIGINT AS turn_records "
        "FROM scan WHERE kind = 'turn' GROUP BY episode_id"
    )
    parquet_files = []
    for path in inputs.parquet:
        try:
            kinds = parquet.record_kinds(con, path)
        except InputError as exc:
            unreadable.append((path, str(exc).removeprefix(f"{path}: ")))
            continue
        parquet_files.append(path)
        if "episode" in kinds:
            sql = parquet.episodes_sql(path, kinds["episode"], EPISODE_FIELDS)
            con.execute("INSERT INTO raw_episodes " + sql)
        if "turn" in kinds:
            sql = parquet.turns_sql(path, kinds["turn"], {"episode_id": "VARCHAR"})
            con.execute(
                f"INSERT INTO turn_episodes SELECT episode_id, count(*) FROM ({sql}) "
                f"WHERE episode_id IS NOT NULL GROUP BY episode_id"
            )
    con.execute(CHECKED_SQL.format(schema=SCHEMA_VERSION))
    con.execute(EPISODES_SQL)
    summary = _summarise(con, inputs)
    summary.unreadable = unreadable
    summary.readable = Inputs(
        jsonl, parquet_files, sum(Path(p).stat().st_size for p in [*jsonl, *parquet_files])
    )
    summary.files, summary.bytes = summary.readable.files, summary.readable.total_bytes
    return summary


def _scan_jsonl(
    con: Any, files: list[str], progress: Progress, unreadable: list[tuple[str, str]]
) -> list[str]:
    """Create the `scan` table; a file DuckDB cannot read (a truncated .gz) is dropped and noted,
    and the others read again. Returns the files read."""
    while files:
        sql = SCAN_SQL.format(lines=_read_lines(files), schema=SCHEMA_VERSION)
        try:
            progress.execute(con, sql, "reading logs")
            return files
        except Exception as exc:
            named = [f for f in files if f in str(exc)]
            if not named:
                raise
            culprit = max(named, key=len)
            unreadable.append((culprit, str(exc).strip().splitlines()[0]))
            files.remove(culprit)
            con.execute("DROP TABLE IF EXISTS scan")
    con.execute(
        "CREATE TEMP TABLE scan (file VARCHAR, kind VARCHAR, reason VARCHAR, "
        "line VARCHAR, episode_id VARCHAR, n BIGINT, sample VARCHAR)"
    )
    return files


def _summarise(con: Any, inputs: Inputs) -> ScanSummary:
    summary = ScanSummary(files=inputs.files, bytes=inputs.total_bytes)
    (turn_records,) = con.execute(
        "SELECT coalesce(sum(turn_records), 0) FROM turn_episodes"
    ).fetchone()
    (episode_records,) = con.execute(
        "SELECT coalesce(sum(n), 0) FROM checked WHERE problem IS NULL"
    ).fetchone()
    summary.turn_records = int(turn_records)
    summary.episode_records = int(episode_records)
    summary.episodes = int(con.execute("SELECT count(*) FROM episodes").fetchone()[0])
    summary.duplicates = summary.episode_records - summary.episodes
    rows = con.execute(
        """
        SELECT reason, sum(n)::BIGINT AS n, min(file || ': ' || sample) AS example FROM (
            SELECT reason, n, file, sample FROM scan WHERE kind = 'bad'
            UNION ALL
            SELECT problem, n, file, sample FROM checked WHERE problem IS NOT NULL)
        GROUP BY reason ORDER BY n DESC, reason
        """
    ).fetchall()
    summary.reasons = [(str(r), int(n), str(ex)) for r, n, ex in rows]
    summary.skipped = sum(n for _, n, _ in summary.reasons)
    return summary


def create_turns_view(
    con: Any, inputs: Inputs, name: str = "turns", columns: Mapping[str, str] = TURN_COLUMNS
) -> None:
    """A temp view of every valid turn record with these columns (name → DuckDB type, nested
    types allowed), re-read from the files on each use."""
    parts = []
    if inputs.jsonl:
        spec = ", ".join(f"{sql_str(n)}: {sql_str(t)}" for n, t in columns.items())
        names = ", ".join(f'"{n}"' for n in columns)
        parts.append(
            f"SELECT {names} FROM read_json({sql_list(inputs.jsonl)}, "
            f"format = 'newline_delimited', ignore_errors = true, "
            f"maximum_object_size = {MAX_LINE_BYTES}, "
            f"columns = {{'schema': 'VARCHAR', 'type': 'VARCHAR', {spec}}}) "
            f"WHERE type = 'turn' AND TRY_CAST(schema AS DOUBLE) = {SCHEMA_VERSION} "
            f"AND episode_id IS NOT NULL"
        )
    for path in inputs.parquet:
        kinds = parquet.record_kinds(con, path)
        if "turn" in kinds:
            parts.append(parquet.turns_sql(path, kinds["turn"], columns))
    if not parts:
        empty = ", ".join(f'CAST(NULL AS {t}) AS "{n}"' for n, t in columns.items())
        parts.append(f"SELECT {empty} WHERE false")
    con.execute(f"CREATE OR REPLACE TEMP VIEW {name} AS " + " UNION ALL ".join(parts))
