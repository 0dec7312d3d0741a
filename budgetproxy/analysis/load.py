"""Reading trajectory logs (JSONL, .jsonl.gz, Parquet) into DuckDB, counting what is skipped.

Episode records become the temp table `episodes`: validated, typed, one row per episode_id.
Of several records of one episode the last wins: the one in the later file (in the order the
files were found), and within a file the later line. Only the episode fields the analysis
reads are kept, never the line itself. `turn_episodes` counts turn records per episode. Turn
records stay in the files: `create_turns_view` defines views that re-read them for the
recovery view and the Parquet export, so they never become Python objects. A line that is
not valid UTF-8 (torn inside a multi-byte character) is skipped and counted like any other
bad line.
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
    "AXIS_FIELDS", "EPISODE_FIELDS", "TABLE_FIELDS", "TURN_COLUMNS", "InputError", "Inputs",
    "ScanSummary", "connect", "create_turns_view", "discover", "load_episodes", "sql_list",
    "sql_str",
]  # fmt: skip

LOG_SUFFIXES = (".jsonl", ".jsonl.gz", ".parquet")
# The longest line read: twice the proxy's default request size cap (server.max_body_bytes,
# 32 MiB), so a turn record carrying a whole request fits. Longer lines are skipped and
# counted. DuckDB's readers hold buffers of a few times this size per thread, and those count
# against the memory limit.
MAX_LINE_BYTES = 64 << 20

# Episode fields read from each record; all arrive as text and are validated in SQL.
# The episode record's fields beside turns (the budgets in other units, docs/budgets.md) and
# its metadata, with the type each is read as: only the exports read them.
AXIS_FIELDS = {
    "metadata": "JSON", "token_budget": "BIGINT", "tokens_used": "BIGINT",
    "cost_budget": "DOUBLE", "cost_used": "DOUBLE", "time_budget_s": "DOUBLE",
    "time_used_s": "DOUBLE", "exhausted_by": "VARCHAR", "announced_tokens": "BIGINT",
    "announced_cost": "DOUBLE", "announced_time_s": "DOUBLE", "full_token_budget": "BIGINT",
    "full_cost_budget": "DOUBLE", "full_time_budget_s": "DOUBLE",
}  # fmt: skip
EPISODE_FIELDS = (
    "episode_id", "task_id", "group", "tags", "model", "budget", "max_turns", "tier",
    "disclosure", "announced_budget", "turns_used", "outcome", "success_turn", "reward",
    "exhausted", "end_reason", "started_at", "ended_at", "min_turns", *AXIS_FIELDS,
)  # fmt: skip
# What the tables, the report, the audit and the recovery view read; the rest (timestamps,
# reward, the exhausted flag, the other axes) only the exports need, so they alone read them.
TABLE_FIELDS = tuple(
    f for f in EPISODE_FIELDS
    if f not in ("reward", "exhausted", "started_at", "ended_at", *AXIS_FIELDS)
)

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
    # every file in the order found: later files win over earlier ones for the same episode
    order: list[str] = field(default_factory=list)

    @property
    def files(self) -> int:
        return len(self.jsonl) + len(self.parquet)

    def ranks(self) -> dict[str, int]:
        """file → its position in the order found."""
        ordered = self.order or [*self.jsonl, *self.parquet]
        return {f: i for i, f in enumerate(ordered)}


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
    order: list[str] = []
    total = 0
    for path in found:
        key = path.resolve()
        if key in seen:
            continue
        seen.add(key)
        total += path.stat().st_size
        (parquet if path.name.endswith(".parquet") else jsonl).append(str(path))
        order.append(str(path))
    return Inputs(jsonl=jsonl, parquet=parquet, total_bytes=total, order=order)


REJECTS = "bp_rejects"  # DuckDB's table of lines its CSV reader could not read
REJECT_SCANS = "bp_reject_scans"


def _read_lines(files: Sequence[str]) -> str:
    # Each line as one VARCHAR: \x01 never occurs unescaped in JSON text, and no quoting. A
    # line that is not valid UTF-8 goes to the rejects table and is counted, instead of failing
    # the file; one longer than the limit DuckDB drops unrecorded (see _count_long_lines). The
    # ordinality numbers the lines in file order, then line order: the last record wins by it.
    return (
        f"read_csv({sql_list(files)}, columns = {{'line': 'VARCHAR'}}, header = false, "
        f"delim = '\x01', quote = '', escape = '', filename = true, auto_detect = false, "
        f"max_line_size = {MAX_LINE_BYTES}, buffer_size = {MAX_LINE_BYTES}, "
        f"strict_mode = false, null_padding = true, "
        f"ignore_errors = true, store_rejects = true, rejects_table = '{REJECTS}', "
        f"rejects_scan = '{REJECT_SCANS}') WITH ORDINALITY"
    )


# One pass over every line, parsed once for its schema, type and episode_id. Of an episode
# line only the fields the analysis reads are kept (`v`), one row per line; turn lines are
# only counted, per file and episode; probe and experiment lines passed over (they belong to
# no episode);
# anything else is grouped by the reason it is skipped.
SCAN_SQL = """
CREATE TEMP TABLE scan AS
WITH head AS (
    SELECT filename AS file, ordinality AS ord, line,
        CASE WHEN line IS NOT NULL
             THEN try(json_extract_string(line, ['$.schema', '$.type', '$.episode_id'])) END
            AS h
    FROM {lines}
), kinded AS (
    -- CASE evaluates a branch only for the rows that reach it: trim() runs on bad lines only
    SELECT file, ord, line, h,
        CASE WHEN line IS NULL THEN 'blank'
             WHEN h IS NULL THEN (CASE WHEN trim(line) = '' THEN 'blank' ELSE 'bad' END)
             WHEN h[2] = 'episode' THEN 'episode'
             WHEN h[1] = '{schema}' AND h[2] = 'turn' AND h[3] IS NOT NULL THEN 'turn'
             -- a probe's calls (budgetproxy probe) belong to no episode, nor do an experiment's
             -- records, and a CLI's free compaction calls spend no turn of one: not read, not bad
             WHEN h[1] = '{schema}' AND h[2] IN ('probe', 'experiment', 'experiment_decision')
                THEN 'probe'
             WHEN h[1] = '{schema}' AND h[2] = 'compaction' THEN 'compaction'
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
    CASE WHEN kind = 'episode' THEN ord END AS ord,
    CASE WHEN kind = 'turn' THEN h[3] END AS episode_id,
    count(*) AS n, sum(coalesce(strlen(line), 0) + 1) AS bytes,
    min(CASE WHEN kind = 'bad' THEN left(line, 100) END) AS sample,
    any_value(CASE WHEN kind = 'episode' THEN try(json_extract_string(line, {paths})) END) AS v
FROM kinded GROUP BY ALL
"""

# Lines the reader rejected, by reason, with the first as an example.
REJECTED_SQL = f"""
CREATE TEMP TABLE rejected AS
SELECT s.file_path AS file,
    CASE r.error_type WHEN 'INVALID ENCODING' THEN 'not valid UTF-8 (torn line?)'
         WHEN 'LINE SIZE OVER MAXIMUM' THEN 'line longer than {MAX_LINE_BYTES:,} bytes'
         ELSE 'unreadable line (' || lower(CAST(r.error_type AS VARCHAR)) || ')' END AS reason,
    count(*) AS n, sum(strlen(coalesce(r.csv_line, '')) + 1) AS bytes,
    min('line ' || r.line || ': ' || left(coalesce(r.csv_line, ''), 80)) AS sample
FROM {REJECTS} r JOIN {REJECT_SCANS} s USING (scan_id, file_id)
GROUP BY ALL
"""

RAW_EPISODES_SQL = """
CREATE TEMP TABLE raw_episodes AS
SELECT file, ord, v IS NULL AS unparsable, {columns} FROM scan WHERE kind = 'episode'
"""

INT_MACRO = """
CREATE OR REPLACE TEMP MACRO bp_int(s) AS
    CASE WHEN TRY_CAST(s AS DOUBLE) = floor(TRY_CAST(s AS DOUBLE))
          AND abs(TRY_CAST(s AS DOUBLE)) < 1e15
         THEN TRY_CAST(TRY_CAST(s AS DOUBLE) AS BIGINT) END
"""

# Validation in one CASE: the first problem found is the reason the record is skipped.
CHECKED_SQL = """
CREATE TEMP VIEW checked AS
SELECT *, 'episode ' || coalesce(episode_id, '?') AS sample,
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

# The last record of each episode wins: later file (in the order found), then later line.
EPISODES_SQL = """
CREATE TEMP TABLE episodes AS
WITH typed AS (
    SELECT c.file, episode_id, task_id, "group",
        CASE WHEN json_valid(tags) AND json_type(tags) = 'OBJECT' THEN tags::JSON END AS tags,
        model, bp_int(budget) AS budget, bp_int(max_turns) AS max_turns, tier, disclosure,
        bp_int(announced_budget) AS announced_budget, bp_int(turns_used) AS turns_used,
        -- the task's fewest turns as the harness stated it (--ceiling); not a positive whole
        -- number: unstated, and the episode still counts
        CASE WHEN bp_int(min_turns) >= 1 THEN bp_int(min_turns) END AS min_turns,
        outcome, bp_int(success_turn) AS recorded_success_turn,
        TRY_CAST(reward AS DOUBLE) AS reward, TRY_CAST(exhausted AS BOOLEAN) AS exhausted,
        end_reason, TRY_CAST(started_at AS TIMESTAMPTZ) AS started_at,
        TRY_CAST(ended_at AS TIMESTAMPTZ) AS ended_at, {axis_columns},
        outcome = 'success' OR end_reason = 'success' AS success,
        coalesce(f.rank, -1) AS file_rank, c.ord
    FROM checked c LEFT JOIN file_ranks f ON f.file = c.file WHERE problem IS NULL
)
SELECT * EXCLUDE (success, file_rank, ord),
    coalesce(success, false) AS success,
    -- success_turn defaults to the turns used, as the outcome endpoint does
    CASE WHEN success THEN coalesce(recorded_success_turn, turns_used) END AS success_turn
FROM typed
QUALIFY row_number() OVER (PARTITION BY episode_id ORDER BY file_rank DESC, ord DESC) = 1
"""


def _axis_columns() -> str:
    """AXIS_FIELDS typed as the episodes table holds them (invalid values as NULL)."""
    out = []
    for name, kind in AXIS_FIELDS.items():
        if kind == "JSON":
            out.append(f'CASE WHEN json_valid("{name}") AND json_type("{name}") = \'OBJECT\' '
                       f'THEN "{name}"::JSON END AS "{name}"')
        elif kind == "BIGINT":
            out.append(f'bp_int("{name}") AS "{name}"')
        else:
            out.append(f'TRY_CAST("{name}" AS {kind}) AS "{name}"')
    return ", ".join(out)


def load_episodes(
    con: Any, inputs: Inputs, progress: Progress, fields: Sequence[str] = EPISODE_FIELDS
) -> ScanSummary:
    """Read every log file once; leave the temp table `episodes`; return the counts. Of the
    EPISODE_FIELDS only `fields` are read from JSONL lines; the others are NULL."""
    con.execute(INT_MACRO)
    names = ("schema", "type", *(f for f in EPISODE_FIELDS if f in fields))
    paths = sql_list(["$." + name for name in names])
    position = {name: i + 1 for i, name in enumerate(names)}
    columns = ", ".join(
        f'v[{position[name]}] AS "{name}"' if name in position else f'NULL::VARCHAR AS "{name}"'
        for name in ("schema", "type", *EPISODE_FIELDS)
    )
    con.execute("CREATE TEMP TABLE file_ranks (file VARCHAR, rank INTEGER)")
    ranks = inputs.ranks()
    if ranks:
        con.executemany("INSERT INTO file_ranks VALUES (?, ?)", list(ranks.items()))
    unreadable: list[tuple[str, str]] = []
    jsonl = _scan_jsonl(con, list(inputs.jsonl), paths, progress, unreadable)
    con.execute(RAW_EPISODES_SQL.format(columns=columns))
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
    con.execute(EPISODES_SQL.replace("{axis_columns}", _axis_columns()))
    summary = _summarise(con, inputs)
    # The episodes table holds what later steps need: free the lines' extracts.
    con.execute("DROP VIEW checked")
    con.execute("DROP TABLE raw_episodes")
    con.execute("DROP TABLE scan")
    summary.unreadable = unreadable
    summary.readable = Inputs(
        jsonl,
        parquet_files,
        sum(Path(p).stat().st_size for p in [*jsonl, *parquet_files]),
        [f for f in inputs.ranks() if f in set(jsonl) | set(parquet_files)],
    )
    summary.files, summary.bytes = summary.readable.files, summary.readable.total_bytes
    return summary


def _drop_rejects(con: Any) -> None:
    con.execute(f"DROP TABLE IF EXISTS {REJECTS}")
    con.execute(f"DROP TABLE IF EXISTS {REJECT_SCANS}")


def _scan_jsonl(
    con: Any, files: list[str], paths: str, progress: Progress, unreadable: list[tuple[str, str]]
) -> list[str]:
    """Create the `scan` and `rejected` tables; a file DuckDB cannot read at all (a truncated
    .gz) is dropped and noted, and the others read again. Returns the files read."""
    while files:
        sql = SCAN_SQL.format(lines=_read_lines(files), schema=SCHEMA_VERSION, paths=paths)
        _drop_rejects(con)
        try:
            progress.execute(con, sql, "reading logs")
        except Exception as exc:
            named = [f for f in files if f in str(exc)]
            if not named:
                raise
            culprit = max(named, key=len)
            unreadable.append((culprit, str(exc).strip().splitlines()[0]))
            files.remove(culprit)
            con.execute("DROP TABLE IF EXISTS scan")
            continue
        con.execute(REJECTED_SQL)
        _drop_rejects(con)
        _count_long_lines(con, files)
        return files
    con.execute(
        "CREATE TEMP TABLE scan (file VARCHAR, kind VARCHAR, reason VARCHAR, ord BIGINT, "
        "episode_id VARCHAR, n BIGINT, bytes BIGINT, sample VARCHAR, v VARCHAR[])"
    )
    con.execute(
        "CREATE TEMP TABLE rejected (file VARCHAR, reason VARCHAR, n BIGINT, bytes BIGINT, "
        "sample VARCHAR)"
    )
    return files


def _count_long_lines(con: Any, files: Sequence[str]) -> None:
    """Count the lines longer than MAX_LINE_BYTES in uncompressed files.

    DuckDB's reader drops such a line without a word, so the bytes it read are compared with
    the file's size: what is missing, beyond one carriage return per line in a CRLF file, was
    in lines too long to read. Their number is unknown: a file with any counts once.
    (Compressed files have no size to compare with.)"""
    read = {
        str(f): (int(b or 0), int(n or 0))
        for f, b, n in con.execute(
            "SELECT file, sum(bytes), sum(n) FROM (SELECT file, bytes, n FROM scan "
            "UNION ALL SELECT file, bytes, n FROM rejected) GROUP BY file"
        ).fetchall()
    }
    for path in files:
        if path.endswith(".gz"):
            continue
        seen, lines = read.get(path, (0, 0))
        with open(path, "rb") as f:
            crlf = f.readline(1 << 20).endswith(b"\r\n")
        missing = Path(path).stat().st_size - seen - (lines if crlf else 0)
        if missing >= MAX_LINE_BYTES // 2:
            con.execute(
                "INSERT INTO rejected VALUES (?, ?, ?, ?, ?)",
                [path, f"line longer than {MAX_LINE_BYTES:,} bytes", 1, missing,
                 f"{missing:,} bytes in one or more lines too long to read"],
            )  # fmt: skip


def _summarise(con: Any, inputs: Inputs) -> ScanSummary:
    summary = ScanSummary(files=inputs.files, bytes=inputs.total_bytes)
    (turn_records,) = con.execute(
        "SELECT coalesce(sum(turn_records), 0) FROM turn_episodes"
    ).fetchone()
    (episode_records,) = con.execute(
        "SELECT count(*) FROM checked WHERE problem IS NULL"
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
            SELECT reason, n, file, sample FROM rejected
            UNION ALL
            SELECT problem, 1, file, sample FROM checked WHERE problem IS NOT NULL)
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
