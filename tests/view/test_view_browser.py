"""The episode view and the report's links to it, in a real headless Chromium."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from browser_support import chromium
from view_support import story, turn_record

from budgetproxy.cli import main
from budgetproxy.view.page import episode_page_name

ATTACK = '<script>window.pwned = 1</script><img src=x onerror="window.pwned = 2">'


@pytest.fixture
def logs(tmp_path: Path) -> Path:
    """Two tasks' episodes; one reply and one task id carry markup meant to run."""
    folder = tmp_path / "trajectories"
    folder.mkdir()
    records = story("ep-1", "t1") + story("ep-2", "t1") + story("ep-3", "t<b>2</b>")
    records.insert(0, turn_record("ep-3", 1, task_id="t<b>2</b>",
                                  response={"role": "assistant", "content": ATTACK}))
    (folder / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return folder


def test_served_pages_render_and_their_links_lead_from_tasks_to_turns(logs: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "budgetproxy", "view", str(logs), "--serve"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().split(" on ", 1)[1].split(" ", 1)[0]
        with chromium() as browser:
            tab = browser.new_tab()
            tab.goto(url)
            assert tab.eval("document.title") == "Episodes by task"
            assert tab.eval("[...document.querySelectorAll('td a')].map(a => a.textContent)"
                            ) == ["t1", "t<b>2</b>"]
            tab.click("td a")
            assert tab.eval("document.title") == "Task t1"
            assert tab.eval("document.querySelectorAll('tbody tr, table tr').length") == 3
            tab.click("td a")
            assert tab.eval("document.title") == "Episode ep-1"
            heads = tab.eval("[...document.querySelectorAll('section.turn h3')]"
                             ".map(h => h.textContent)")
            assert heads == ["Turn 1 charged", "Turn 2 upstream error, refunded",
                             "Turn 2 charged", "Turn 2 attempt 2 free retry", "Turn 3 charged",
                             "Turn 4 refused (not forwarded)"]
            assert tab.eval("document.querySelectorAll('.budget-text').length") == 5
            # laid out: the turns are boxes of the page's width, not collapsed or overflowing
            width = tab.eval("document.querySelector('section.turn').getBoundingClientRect()"
                             ".width")
            assert 300 < width <= tab.eval("document.documentElement.clientWidth")
            tab.click("nav a:nth-of-type(2)")
            assert tab.eval("document.title") == "Task t1"
            # the other task's episode holds markup from the log: shown as text, never run
            tab.goto(url.rsplit("/", 1)[0] + "/" + episode_page_name("ep-3"))
            assert tab.eval("typeof window.pwned") == "undefined"
            assert tab.eval("document.querySelectorAll('img, script').length") == 0
            assert ATTACK in tab.eval("document.body.textContent")
            assert tab.eval("document.querySelector('nav a:nth-of-type(2)').textContent"
                            ) == "task t<b>2</b>"
            png = tab.screenshot()
            assert png.startswith(b"\x89PNG") and len(png) > 10_000
        assert not browser.console, browser.console
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(20)


def test_the_reports_task_rows_open_the_episode_pages(logs: Path, tmp_path: Path) -> None:
    report, view = tmp_path / "out" / "report.html", tmp_path / "out" / "episodes"
    assert main(["analyze", str(logs), "--report", str(report), "--view", str(view)]) == 0
    with chromium() as browser:
        tab = browser.new_tab()
        tab.goto(report.as_uri())
        rows = tab.eval("[...document.querySelectorAll('h2 ~ table a')]"
                        ".map(a => [a.textContent, a.getAttribute('href')])")
        assert [r[0] for r in rows if r[1].startswith("episodes/task-")] == ["t1", "t<b>2</b>"]
        tab.click("a[href^='episodes/task-']")
        assert tab.eval("document.title") == "Task t1"
        tab.click("td a")
        assert tab.eval("document.title") == "Episode ep-1"
        assert tab.eval("document.querySelectorAll('section.turn').length") == 6
