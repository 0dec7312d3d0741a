"""Reading logs for the episode view (view/logs.py): files and folders, gzip, filters, bad
lines."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from view_support import story

from budgetproxy.view.logs import read_episodes


def write(path: Path, records: list[dict[str, object]], extra: bytes = b"") -> Path:
    data = "".join(json.dumps(r) + "\n" for r in records).encode() + extra
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.name.endswith(".gz"):
        path.write_bytes(gzip.compress(data))
    else:
        path.write_bytes(data)
    return path


def test_a_folder_of_plain_and_gzipped_logs(tmp_path: Path) -> None:
    write(tmp_path / "logs" / "a.jsonl", story("ep-1", "t1"))
    write(tmp_path / "logs" / "sub" / "b.jsonl.gz", story("ep-2", "t2"))
    (tmp_path / "logs" / "notes.txt").write_text("not a log")
    logs = read_episodes([tmp_path / "logs"])
    assert logs.files == 2 and logs.skipped_lines == 0
    assert [e.episode_id for e in logs.episodes] == ["ep-1", "ep-2"]
    first = logs.episodes[0]
    assert first.record is not None and first.record["end_reason"] == "exhausted"
    assert [(t["turn"], t["attempt"], t["status"]) for t in first.turns] == [
        (1, 1, "ok"), (2, 1, "upstream_error"), (2, 1, "ok"), (2, 2, "ok"), (3, 1, "ok"),
        (4, 1, "rejected")]
    assert first.task_id == "t1"


def test_one_episode_or_one_task(tmp_path: Path) -> None:
    write(tmp_path / "a.jsonl", story("ep-1", "t1") + story("ep-2", "t2") + story("ep-3", "t1"))
    assert [e.episode_id for e in read_episodes([tmp_path], episode="ep-2").episodes] == ["ep-2"]
    assert [e.episode_id for e in read_episodes([tmp_path], task="t1").episodes] == [
        "ep-1", "ep-3"]
    assert read_episodes([tmp_path], episode="nope").episodes == []


def test_bad_lines_are_counted_and_a_cut_gzip_keeps_what_was_read(tmp_path: Path) -> None:
    write(tmp_path / "a.jsonl", story("ep-1"), b'not json\n[1]\n{"schema": 2}\n\n{"schema": 1}\n')
    whole = gzip.compress("".join(json.dumps(r) + "\n" for r in story("ep-2")).encode())
    (tmp_path / "b.jsonl.gz").write_bytes(whole[: len(whole) // 2])
    logs = read_episodes([tmp_path])
    assert logs.skipped_lines == 5  # four bad lines, and the cut file
    assert logs.episodes[0].episode_id == "ep-1" and len(logs.episodes[0].turns) == 6


def test_a_missing_path_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no such file or folder"):
        read_episodes([tmp_path / "missing"])
