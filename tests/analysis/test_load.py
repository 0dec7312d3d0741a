"""Reading logs: bad lines skipped and counted, gzip, folders, Parquet round trip."""

from __future__ import annotations

import gzip
import io
import json
import time
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from records_support import episode_record

from budgetproxy.analysis import load
from budgetproxy.analysis.export import export_parquet
from budgetproxy.analysis.progress import Progress
from budgetproxy.analysis.table import Budget, compute_cells


def episode(eid: str, task: str = "t1", **fields: Any) -> dict[str, Any]:
    return episode_record(eid, **{
        "task_id": task, "group": "g", "tags": {"split": "test"}, "turns_used": 2,
        "outcome": "success", "success_turn": 2, "reward": 1.0, "end_reason": "success",
        **fields})


def turn(eid: str, n: int, **fields: Any) -> dict[str, Any]:
    record: dict[str, Any] = {
        "schema": 1, "type": "turn", "episode_id": eid, "turn": n, "attempt": 1,
        "ts": "2026-11-30T10:00:01.000Z", "latency_s": 0.5, "model": "m", "status": "ok",
        "http_status": 200, "request_messages": [{"role": "user", "content": "go"}],
        "messages_offset": 0, "response": {"content": "ok", "tool_calls": None},
        "finish_reason": "stop", "usage": {"prompt_tokens": 3, "completion_tokens": 1},
        "budget": 5, "remaining": 5 - n, "disclosure": {"arm": "hidden", "text": None},
    }  # fmt: skip
    record.update(fields)
    return record


def lines(records: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


@pytest.fixture
def con() -> Iterator[Any]:
    with load.connect() as c:
        yield c


def read(con: Any, *paths: Path) -> load.ScanSummary:
    return load.load_episodes(con, load.discover([str(p) for p in paths]), Progress(0))


def test_bad_lines_are_skipped_and_counted_with_reasons(tmp_path: Path, con: Any) -> None:
    good = lines([turn("a", 1), turn("a", 2), episode("a"), episode("b", task="t2")])
    bad_episode = dict(episode("c"))
    del bad_episode["budget"]
    text = good + "\n".join([
        '{"schema": 1, "type": "turn", "episode_id": "x", "tu',  # truncated
        "this is not json",
        json.dumps(turn("y", 1, schema=2)),
        json.dumps(episode("z", schema=99)),
        json.dumps({"schema": 1, "type": "heartbeat"}),
        json.dumps(bad_episode),
        json.dumps(episode("d", disclosure="maybe")),
        '{"schema": 1, "type": "episode", "episode_id": "e", "budg',  # truncated episode
        "[1, 2, 3]",
        "",
        "   ",
    ]) + "\n"  # fmt: skip
    path = tmp_path / "log.jsonl"
    path.write_text(text)
    summary = read(con, path)
    assert (summary.turn_records, summary.episode_records, summary.episodes) == (2, 2, 2)
    assert summary.skipped == 9
    reasons = {reason: n for reason, n, _ in summary.reasons}
    assert reasons["not valid JSON (truncated line?)"] == 3
    assert reasons["unknown schema version 2"] == 1
    assert reasons["unknown schema version 99"] == 1
    assert reasons["unknown record type heartbeat"] == 1
    assert reasons["episode: missing or invalid budget"] == 1
    assert reasons["episode: missing or unknown disclosure arm"] == 1
    assert reasons['no "schema" field'] == 1
    example = next(ex for r, _, ex in summary.reasons if r.startswith("not valid"))
    assert example.startswith(str(path))


def test_gzip_and_plain_files_in_nested_folders(tmp_path: Path, con: Any) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "one.jsonl").write_text(lines([turn("e1", 1), episode("e1")]))
    with gzip.open(tmp_path / "a" / "b" / "two.jsonl.gz", "wt") as f:
        f.write(lines([turn("e2", 1), turn("e2", 2), episode("e2")]))
    (tmp_path / "a" / "notes.txt").write_text("not a log")
    inputs = load.discover([str(tmp_path)])
    assert [Path(p).name for p in inputs.jsonl] == ["two.jsonl.gz", "one.jsonl"]
    summary = read(con, tmp_path)
    assert (summary.files, summary.turn_records, summary.episodes) == (2, 3, 2)


def test_a_file_named_directly_is_read_whatever_its_suffix(tmp_path: Path, con: Any) -> None:
    path = tmp_path / "log.txt"
    path.write_text(lines([episode("e1")]))
    assert read(con, path).episodes == 1


def test_missing_path_is_an_input_error_with_exit_code_2(tmp_path: Path) -> None:
    with pytest.raises(load.InputError) as err:
        load.discover([str(tmp_path / "nope")])
    assert err.value.exit_code == 2 and "nope" in str(err.value)


def test_the_same_file_given_twice_is_read_once(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    path.write_text(lines([episode("e1")]))
    assert load.discover([str(path), str(tmp_path)]).jsonl == [str(path)]


def test_parquet_round_trip(tmp_path: Path) -> None:
    records = [turn("a", 1), turn("a", 2),
               episode("a", tags={"policy": "rl"}, metadata={"judge": "exact"},
                       token_budget=100, tokens_used=40, cost_budget=0.5, cost_used=0.125,
                       time_budget_s=60.0, time_used_s=1.5, exhausted_by=None),
               turn("b", 1), episode("b", outcome="failure", end_reason="exhausted",
                                     success_turn=None, exhausted=True, turns_used=5),
               episode("c", task="t2", disclosure="disclosed", announced_budget=5)]  # fmt: skip
    log = tmp_path / "log.jsonl"
    log.write_text(lines(records))
    budgets = [Budget("tier", Fraction(50)), Budget("turns", Fraction(2))]
    with load.connect() as con:
        first = read(con, log)
        cells = compute_cells(con, [1, 2], budgets, ["policy", "disclosure"], 100, 0)
        load.create_turns_view(con, load.discover([str(log)]))
        episodes_file, turns_file = export_parquet(con, tmp_path / "pq", Progress(0))
        original = con.execute("SELECT * EXCLUDE (file) FROM episodes ORDER BY 1").fetchall()
    assert episodes_file.exists() and turns_file.exists()
    with load.connect() as con:
        again = read(con, tmp_path / "pq")
        cells_again = compute_cells(con, [1, 2], budgets, ["policy", "disclosure"], 100, 0)
        reread = con.execute("SELECT * EXCLUDE (file) FROM episodes ORDER BY 1").fetchall()
        columns = [d[0] for d in con.execute(
            f"SELECT * FROM read_parquet('{episodes_file}') LIMIT 0").description]
        assert con.execute("SELECT token_budget, cost_used, metadata ->> 'judge' FROM episodes "
                           "WHERE episode_id = 'a'").fetchone() == (100, 0.125, "exact")
        load.create_turns_view(con, load.discover([str(tmp_path / "pq")]))
        turn_rows = con.execute(
            "SELECT episode_id, turn, response ->> 'content', disclosure ->> 'arm' FROM turns "
            "ORDER BY 1, 2"
        ).fetchall()
        ts_type = con.execute(
            f"SELECT typeof(ts) FROM read_parquet('{turns_file}') LIMIT 1"
        ).fetchone()[0]
    assert (again.episodes, again.turn_records, again.skipped) == (3, 3, 0)
    assert first.turn_records == 3
    assert reread == original
    assert {"metadata", "token_budget", "exhausted_by"} <= set(columns)
    assert [c.as_json() for c in cells_again] == [c.as_json() for c in cells]
    assert turn_rows == [
        ("a", 1, "ok", "hidden"),
        ("a", 2, "ok", "hidden"),
        ("b", 1, "ok", "hidden"),
    ]
    assert ts_type.startswith("TIMESTAMP")


class _TTY(io.StringIO):
    def isatty(self) -> bool:
        return True


class _SlowQuery:
    """Stands in for a DuckDB connection running a long statement."""

    def execute(self, sql: str) -> str:
        time.sleep(0.7)
        return sql

    def query_progress(self) -> float:
        return 42.0


def test_progress_shows_on_a_tty_for_large_inputs_only() -> None:
    stream = _TTY()
    assert Progress(10**10, stream).execute(_SlowQuery(), "SELECT 1", "reading logs") == "SELECT 1"
    shown = stream.getvalue()
    assert "\rreading logs:  42.0%" in shown and shown.endswith("\r\033[K")
    quiet = _TTY()
    Progress(1000, quiet).execute(_SlowQuery(), "SELECT 1", "reading logs")
    assert quiet.getvalue() == ""
    piped = io.StringIO()
    Progress(10**6, piped).execute(_SlowQuery(), "SELECT 1", "reading logs")
    assert piped.getvalue() == ""


def test_an_unreadable_file_is_skipped_and_named(tmp_path: Path, con: Any) -> None:
    (tmp_path / "good.jsonl").write_text(lines([turn("a", 1), episode("a")]))
    whole = gzip.compress(lines([episode(f"e{i}") for i in range(2000)]).encode())
    (tmp_path / "cut.jsonl.gz").write_bytes(whole[: len(whole) // 2])  # a rotation cut short
    (tmp_path / "broken.parquet").write_text("not parquet")
    summary = read(con, tmp_path)
    assert (summary.episodes, summary.turn_records, summary.files) == (1, 1, 1)
    assert sorted(Path(f).name for f, _ in summary.unreadable) == ["broken.parquet",
                                                                   "cut.jsonl.gz"]  # fmt: skip
    assert summary.readable.jsonl == [str(tmp_path / "good.jsonl")]


def test_lines_that_are_not_utf8_are_skipped_and_counted(tmp_path: Path, con: Any) -> None:
    # The proxy writes raw UTF-8: a crash mid-write can tear a line inside a multi-byte
    # character. That line, and one with a stray invalid byte, are skipped; the file is read.
    good = lines([turn("a", 1, response={"content": "déjà vu ✓"}), episode("a"),
                  episode("b", task="t2", tags={"note": "naïve"})]).encode()  # fmt: skip
    torn = json.dumps(episode("c"), ensure_ascii=False).encode()[:-3] + "é".encode()[:1]
    stray = json.dumps(episode("d")).encode().replace(b'"t1"', b'"t\xff1"')
    path = tmp_path / "log.jsonl"
    path.write_bytes(good + torn + b"\n" + stray + b"\n" + lines([episode("e")]).encode())
    with gzip.open(tmp_path / "more.jsonl.gz", "wb") as f:
        f.write(lines([episode("f")]).encode() + b'{"schema": 1, "type": "turn", "x": "\xe2\x82')
    summary = read(con, path, tmp_path / "more.jsonl.gz")
    assert summary.unreadable == []
    assert (summary.turn_records, summary.episodes) == (1, 4)  # a, b, e, f
    reasons = {reason: n for reason, n, _ in summary.reasons}
    assert reasons == {"not valid UTF-8 (torn line?)": 3}
    example = next(ex for _, _, ex in summary.reasons)
    assert example.startswith(str(path)) and "line 4" in example


def test_a_line_past_the_limit_is_skipped_and_counted(
    tmp_path: Path, con: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(load, "MAX_LINE_BYTES", 1 << 20)
    huge = turn("a", 1, request_messages=[{"role": "tool", "content": "x" * (3 << 20)}])
    path = tmp_path / "log.jsonl"
    path.write_text(lines([turn("a", 1), huge, episode("a"), episode("b")]))
    summary = read(con, path)
    assert (summary.turn_records, summary.episodes, summary.skipped) == (1, 2, 1)
    assert summary.reasons[0][0].startswith("line longer than")
    crlf = tmp_path / "crlf.jsonl"
    crlf.write_bytes(lines([turn("a", 1), episode("a")]).replace("\n", "\r\n").encode())
    with load.connect() as other:
        assert read(other, crlf).skipped == 0  # carriage returns are not missing bytes


def test_the_connection_is_held_to_a_memory_limit_and_spills(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    path.write_text(lines([episode(f"e{i}", task=f"t{i % 50}") for i in range(20_000)]))
    with load.connect("64MB") as con:
        (limit,) = con.execute("SELECT current_setting('memory_limit')").fetchone()
        (spill,) = con.execute("SELECT current_setting('temp_directory')").fetchone()
        assert limit.endswith("MiB") and float(limit.split()[0]) < 64
        assert Path(spill).is_dir()
        summary = read(con, path)
    assert summary.episodes == 20_000


def test_last_record_wins_across_parquet_and_jsonl_in_the_order_given(tmp_path: Path) -> None:
    won = lines([episode("a"), episode("b")])
    lost = lines([episode("a", outcome="failure", end_reason="failure", success_turn=None),
                  episode("b", outcome="failure", end_reason="failure", success_turn=None)])
    (tmp_path / "won.jsonl").write_text(won)
    with load.connect() as con:
        read(con, tmp_path / "won.jsonl")
        load.create_turns_view(con, load.discover([str(tmp_path / "won.jsonl")]))
        episodes_file, _ = export_parquet(con, tmp_path / "pq", Progress(0))
    (tmp_path / "lost.jsonl").write_text(lost)

    def successes(*paths: Path) -> int:
        with load.connect() as con:
            read(con, *paths)
            return int(con.execute("SELECT count(*) FROM episodes WHERE success").fetchone()[0])

    assert successes(tmp_path / "lost.jsonl", episodes_file) == 2  # the Parquet file is later
    assert successes(episodes_file, tmp_path / "lost.jsonl") == 0


def test_compaction_and_probe_records_are_passed_over_not_bad(tmp_path: Path, con: Any) -> None:
    compaction = {"schema": 1, "type": "compaction", "episode_id": "a", "charged": False,
                  "request_messages": [], "response": None}
    probe = {"schema": 1, "type": "probe", "probe_id": "p", "request_messages": []}
    path = tmp_path / "log.jsonl"
    path.write_text(lines([turn("a", 1), episode("a")]) + json.dumps(compaction) + "\n"
                    + json.dumps(probe) + "\n")
    summary = read(con, path)
    assert (summary.turn_records, summary.episode_records, summary.skipped) == (1, 1, 0)
