"""DuckDB plumbing for the analysis: the connection, SQL literals, the one-line input error."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any


class InputError(Exception):
    """Input that cannot be analysed at all; the message is one line for the user."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@contextmanager
def connect(memory_limit: str = "1GB", command: str = "analyze") -> Iterator[Any]:
    """An in-memory DuckDB connection held to `memory_limit`: past it, DuckDB spills tables
    and operators to a private temp dir, removed afterwards. `command` is the subcommand
    that needs it, named when DuckDB is not installed."""
    try:
        import duckdb
    except ImportError as exc:
        raise InputError(
            f"{command} needs DuckDB: pip install 'budgetproxy[analyze]'", exit_code=2
        ) from exc
    spill = tempfile.mkdtemp(prefix="budgetproxy-analyze-")
    con = duckdb.connect(":memory:")
    try:
        con.execute(f"SET temp_directory = {sql_str(spill)}")
        con.execute(f"SET memory_limit = {sql_str(memory_limit)}")
        con.execute("SET TimeZone = 'UTC'")
        con.execute("SET preserve_insertion_order = false")
        con.execute("SET enable_progress_bar = true")  # feeds query_progress() ...
        con.execute("SET enable_progress_bar_print = false")  # ... without DuckDB's own bar
        yield con
    finally:
        con.close()
        shutil.rmtree(spill, ignore_errors=True)


def sql_str(value: str) -> str:
    """A SQL string literal."""
    return "'" + value.replace("'", "''") + "'"


def sql_list(values: Sequence[str]) -> str:
    """A SQL list of string literals."""
    return "[" + ", ".join(sql_str(v) for v in values) + "]"
