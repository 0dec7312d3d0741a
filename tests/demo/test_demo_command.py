"""`budgetproxy demo --figure` without Chromium: one line and exit 2 before the run starts."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from budgetproxy.cli import main
from budgetproxy.demo import run as demo_run


def test_no_chromium_fails_at_once_without_running_the_demo(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)  # the lookup finds nothing

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("the demo ran")

    monkeypatch.setattr(demo_run, "run_demo", never)
    out = tmp_path / "out"
    code = main(["demo", "--out", str(out), "--figure", str(tmp_path / "figure.png")])
    err = capsys.readouterr().err
    assert code == 2
    assert err.splitlines() == [
        "budgetproxy demo: --figure: the figure is drawn by headless Chromium, which is not "
        "installed (Debian: apt-get install chromium)"]
    assert not out.exists()


def test_no_chromium_on_path_exits_2_with_no_traceback(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": str(tmp_path)}  # nothing on PATH: no chromium
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "budgetproxy", "demo", "--out", str(tmp_path / "out"),
         "--figure", str(tmp_path / "figure.png")],
        capture_output=True, text=True, timeout=60, env=env,
    )
    assert done.returncode == 2, done.stderr
    assert "apt-get install chromium" in done.stderr and "Traceback" not in done.stderr
    assert done.stdout == "" and len(done.stderr.splitlines()) == 1
    assert time.monotonic() - started < 30  # not the demo's minutes
    assert not (tmp_path / "out").exists()


def test_run_demo_checks_for_chromium_before_anything_else(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)  # the lookup finds nothing
    settings = demo_run.DemoSettings(out=tmp_path / "out", figure=tmp_path / "figure.png")
    with pytest.raises(RuntimeError, match="apt-get install chromium"):
        demo_run.run_demo(settings)
    assert not (tmp_path / "out").exists()
