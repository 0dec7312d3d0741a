"""Reading trajectory logs into episodes for the episode view: turn and episode records by id.

Plain JSON lines (``.jsonl`` and ``.jsonl.gz``), read one line at a time with no database:
the view needs only the records of the episodes it shows. Lines that are not JSON objects of
schema 1 are skipped and counted. Of several episode records for one id the last read wins,
as in the analysis.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

LOG_SUFFIXES = (".jsonl", ".jsonl.gz")


@dataclass
class EpisodeLog:
    """Everything the logs hold about one episode: its end record (None while it runs or when
    the file with it was not given) and its turn records in the order they were written."""

    episode_id: str
    record: dict[str, Any] | None = None
    turns: list[dict[str, Any]] = field(default_factory=list)

    @property
    def task_id(self) -> str | None:
        source = self.record if self.record is not None else (self.turns or [{}])[0]
        task = source.get("task_id")
        return task if isinstance(task, str) else None


@dataclass
class ViewLogs:
    """The episodes read, in the order their first record appeared, and what was skipped."""

    episodes: list[EpisodeLog]
    files: int
    skipped_lines: int


def log_files(paths: Sequence[str | Path]) -> list[Path]:
    """The log files named or inside the folders named, each folder's files sorted by name
    (the proxy's file names sort in the order they were written)."""
    found: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found += sorted(p for p in path.rglob("*") if p.is_file()
                            and p.name.endswith(LOG_SUFFIXES))  # fmt: skip
        elif path.is_file():
            if path.name.endswith(".parquet"):
                raise ValueError(f"{raw}: the episode view reads the JSONL logs (.jsonl, "
                                 ".jsonl.gz), not Parquet")
            found.append(path)
        else:
            raise FileNotFoundError(f"no such file or folder: {raw}")
    return list(dict.fromkeys(found))


def _open(path: Path) -> IO[bytes]:
    if path.name.endswith(".gz"):
        return gzip.open(path, "rb")  # type: ignore[return-value]  # a GzipFile is an IO[bytes]
    return path.open("rb")


def _records(files: Sequence[Path], skipped: list[int]) -> Iterator[dict[str, Any]]:
    for path in files:
        with _open(path) as stream:
            try:
                for line in stream:
                    try:
                        rec = json.loads(line)
                    except ValueError:
                        skipped[0] += bool(line.strip())
                        continue
                    if isinstance(rec, dict) and rec.get("schema") == 1 and isinstance(
                            rec.get("episode_id"), str):
                        yield rec
                    else:
                        skipped[0] += 1
            except (OSError, EOFError):  # a gzip file cut short: keep what was read
                skipped[0] += 1


def read_episodes(
    paths: Sequence[str | Path], episode: str | None = None, task: str | None = None
) -> ViewLogs:
    """The episodes in the logs under `paths`, all of them or only the one `episode` id or
    those of `task`. Turn records are kept in file order; the page sorts them."""
    files = log_files(paths)
    skipped = [0]
    by_id: dict[str, EpisodeLog] = {}
    for rec in _records(files, skipped):
        eid = rec["episode_id"]
        if episode is not None and eid != episode:
            continue
        if task is not None and rec.get("task_id") != task:
            continue
        log = by_id.get(eid)
        if log is None:
            log = by_id[eid] = EpisodeLog(eid)
        if rec.get("type") == "episode":
            log.record = rec
        elif rec.get("type") == "turn":
            log.turns.append(rec)
        else:
            skipped[0] += 1
    return ViewLogs(list(by_id.values()), len(files), skipped[0])
