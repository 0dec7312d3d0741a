"""Parquet export of episodes and turns, for pandas, polars, Spark or DuckDB users.

OUT is a folder that receives `episodes.parquet` (validated, one row per episode) and
`turns.parquet` (every valid turn record). Nested record parts (tags, metadata,
request_messages, response, usage, disclosure) stay JSON text; timestamps become UTC
timestamps. `analyze` and `export` read the folder back like a JSONL log.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from budgetproxy.analysis.db import InputError, sql_str
from budgetproxy.analysis.load import AXIS_FIELDS, TURN_COLUMNS
from budgetproxy.analysis.progress import Progress
from budgetproxy.trajectories.records import SCHEMA_VERSION

EPISODES_SQL = f"""
SELECT {SCHEMA_VERSION} AS schema, 'episode' AS type, episode_id, task_id, "group", tags,
    model, budget, max_turns, tier, disclosure, announced_budget, min_turns, turns_used, outcome,
    recorded_success_turn AS success_turn, reward, exhausted, end_reason, started_at, ended_at,
    {", ".join(f'"{name}"' for name in AXIS_FIELDS)}
FROM episodes ORDER BY episode_id
"""


def _turns_sql() -> str:
    cols = [
        f'TRY_CAST("{n}" AS TIMESTAMPTZ) AS "{n}"' if n == "ts" else f'"{n}"' for n in TURN_COLUMNS
    ]
    return f"SELECT {SCHEMA_VERSION} AS schema, 'turn' AS type, {', '.join(cols)} FROM turns"


def export_parquet(con: Any, out: Path, progress: Progress) -> tuple[Path, Path]:
    """Write OUT/episodes.parquet and OUT/turns.parquet (needs `episodes` and `turns`)."""
    if out.exists() and not out.is_dir():
        raise InputError(f"--to-parquet {out}: exists and is not a folder", exit_code=2)
    out.mkdir(parents=True, exist_ok=True)
    episodes, turns = out / "episodes.parquet", out / "turns.parquet"
    options = "(FORMAT parquet, COMPRESSION zstd)"
    con.execute(f"COPY ({EPISODES_SQL}) TO {sql_str(str(episodes))} {options}")
    progress.execute(
        con, f"COPY ({_turns_sql()}) TO {sql_str(str(turns))} {options}", "writing turns.parquet"
    )
    return episodes, turns
