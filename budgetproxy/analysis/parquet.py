"""Reading Parquet logs: which record types a file holds, and SQL that reads them like JSONL.

A file with a `type` column may hold both kinds (rows filtered by it); otherwise a file with
`end_reason` holds episodes and one with `turn` holds turns, as `--to-parquet` writes them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from budgetproxy.analysis.db import InputError, sql_str
from budgetproxy.trajectories.records import SCHEMA_VERSION

Columns = dict[str, str]  # column name → DuckDB type


def record_kinds(con: Any, path: str) -> dict[str, Columns]:
    """{"episode" | "turn": the file's columns} for the record types the file holds."""
    try:
        rows = con.execute(f"DESCRIBE SELECT * FROM read_parquet({sql_str(path)})").fetchall()
    except Exception as exc:  # duckdb raises its own error classes
        raise InputError(f"{path}: not a readable Parquet file") from exc
    cols = {str(r[0]): str(r[1]) for r in rows}
    if "type" in cols:
        found = con.execute(
            f"SELECT DISTINCT type FROM read_parquet({sql_str(path)}) WHERE type IS NOT NULL"
        ).fetchall()
        return {t: cols for t in {str(r[0]) for r in found} & {"episode", "turn"}}
    if "end_reason" in cols:
        return {"episode": cols}
    if "turn" in cols:
        return {"turn": cols}
    return {}


def _as_text(name: str, sql_type: str) -> str:
    if sql_type.startswith(("STRUCT", "MAP")) or sql_type.endswith("]"):
        return f'CAST(to_json("{name}") AS VARCHAR)'
    return f'CAST("{name}" AS VARCHAR)'


def episodes_sql(path: str, cols: Columns, fields: Sequence[str]) -> str:
    """Rows shaped like `raw_episodes`: file, ord (the row number), unparsable, schema, type,
    fields…"""
    values = [_as_text(n, cols[n]) if n in cols else "NULL" for n in fields]
    schema = _as_text("schema", cols["schema"]) if "schema" in cols else f"'{SCHEMA_VERSION}'"
    where = "WHERE type = 'episode'" if "type" in cols else ""
    return (
        f"SELECT {sql_str(path)}, file_row_number, false, {schema}, 'episode', "
        f"{', '.join(values)} FROM read_parquet({sql_str(path)}, file_row_number = true) {where}"
    )


def turns_sql(path: str, cols: Columns, wanted: Mapping[str, str]) -> str:
    """The `wanted` turn columns with their types; nested parts stored as JSON text are parsed."""
    values = []
    for name, target in wanted.items():
        if name not in cols:
            values.append(f'CAST(NULL AS {target}) AS "{name}"')
        elif target == "JSON" or target.startswith(("STRUCT", "MAP")) or target.endswith("]"):
            text = _as_text(name, cols[name])
            parsed = f"CASE WHEN json_valid({text}) THEN CAST({text} AS JSON) END"
            if target != "JSON":
                parsed = f"TRY_CAST({parsed} AS {target})"
            values.append(f'{parsed} AS "{name}"')
        else:
            values.append(f'TRY_CAST("{name}" AS {target}) AS "{name}"')
    where = "WHERE type = 'turn'" if "type" in cols else ""
    return f"SELECT {', '.join(values)} FROM read_parquet({sql_str(path)}) {where}"
