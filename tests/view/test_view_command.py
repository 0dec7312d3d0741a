"""`budgetproxy view` from the command line: writing pages, filters, exit codes, --serve."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from view_support import story

from budgetproxy.cli import main
from budgetproxy.view.page import INDEX, episode_page_name, task_page_name


@pytest.fixture
def logs(tmp_path: Path) -> Path:
    folder = tmp_path / "trajectories"
    folder.mkdir()
    records = story("ep-1", "t1") + story("ep-2", "t2")
    (folder / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return folder


def test_writes_an_index_a_page_per_task_and_per_episode(
    logs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "view"
    assert main(["view", str(logs), "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted([
        INDEX, task_page_name("t1"), task_page_name("t2"), episode_page_name("ep-1"),
        episode_page_name("ep-2")])
    assert f"2 episode page(s) in {out}; open {out / INDEX}" in capsys.readouterr().err
    assert "2 episodes from 1 log file(s)" in (out / INDEX).read_text()


def test_one_episode_opens_its_own_page(
    logs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "one"
    assert main(["view", str(logs), "--episode", "ep-2", "--out", str(out)]) == 0
    assert (out / episode_page_name("ep-2")).exists()
    assert not (out / episode_page_name("ep-1")).exists()
    assert f"open {out / episode_page_name('ep-2')}" in capsys.readouterr().err
    assert main(["view", str(logs), "--task", "t1", "--out", str(tmp_path / "t")]) == 0
    assert (tmp_path / "t" / episode_page_name("ep-1")).exists()


def test_nothing_matched_is_1_and_a_missing_path_2(
    logs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["view", str(logs), "--episode", "nope", "--out", str(tmp_path / "x")]) == 1
    assert "no records of episode 'nope'" in capsys.readouterr().err
    assert main(["view", str(tmp_path / "missing"), "--out", str(tmp_path / "y")]) == 2
    assert "no such file or folder" in capsys.readouterr().err
    (tmp_path / "e.parquet").write_bytes(b"PAR1")
    assert main(["view", str(tmp_path / "e.parquet"), "--out", str(tmp_path / "z")]) == 2
    assert "reads the JSONL logs (.jsonl, .jsonl.gz), not Parquet" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["view", str(logs), "--episode", "a", "--task", "b"])


def test_serve_answers_on_127_0_0_1_until_interrupted(logs: Path) -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "budgetproxy", "view", str(logs), "--serve"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("budgetproxy view: serving on http://127.0.0.1:"), line
        url = line.split(" on ", 1)[1].split(" ", 1)[0]
        assert url.endswith("/" + INDEX)
        page = httpx.get(url, timeout=10)
        assert page.status_code == 200 and "Episodes by task" in page.text
        base = url.rsplit("/", 1)[0]
        episode = httpx.get(f"{base}/{episode_page_name('ep-1')}", timeout=10)
        assert episode.status_code == 200 and "Turn 4" in episode.text
        assert episode.headers["content-type"] == "text/html; charset=utf-8"
        root = httpx.get(base + "/", timeout=10)
        assert root.status_code == 302 and root.headers["location"] == "/" + INDEX
        # only the flat .html pages: no listing, no other file, no way out of the folder
        for path in ("/..%2f..%2fetc%2fpasswd", "/../a.jsonl", "/sub/index.html", "/x.html",
                     "/index.htm"):
            assert httpx.get(base + path, timeout=10).status_code == 404, path
    finally:
        proc.send_signal(signal.SIGINT)
        code = proc.wait(20)
    assert code == 0


@pytest.mark.parametrize("stop", ["SIGTERM", "SIGINT, ignored by the shell that started it"])
def test_serve_stops_on_sigterm_and_on_a_sigint_its_shell_ignored(logs: Path, stop: str) -> None:
    """A shell starts a background job with SIGINT ignored, and a process manager stops a
    server with SIGTERM: --serve stops cleanly on either (exit 0, "stopped")."""
    argv = [sys.executable, "-m", "budgetproxy", "view", str(logs), "--serve"]
    if stop.startswith("SIGINT"):  # (trap "" INT: what `cmd &` in a script does)
        argv = ["sh", "-c", 'trap "" INT; exec "$@"', "sh", *argv]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("budgetproxy view: serving on http://127.0.0.1:"), line
        url = line.split(" on ", 1)[1].split(" ", 1)[0]
        assert httpx.get(url, timeout=10).status_code == 200
    finally:
        proc.send_signal(signal.SIGTERM if stop == "SIGTERM" else signal.SIGINT)
        try:
            code = proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert code == 0
    assert proc.stderr is not None and "budgetproxy view: stopped" in proc.stderr.read()
