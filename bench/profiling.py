"""Where a server's time goes under load: py-spy samples during wrk, summarized by function."""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import loadgen
from targets import Target


def py_spy() -> str | None:
    here = Path(sys.executable).parent / "py-spy"
    return str(here) if here.exists() else shutil.which("py-spy")


def profile_under_load(
    target: Target, seconds: float, out_dir: Path, stamp: str, connections: int = 32
) -> dict[str, Any]:
    """Record ``target`` with py-spy while wrk loads it; write collapsed stacks and a summary."""
    exe = py_spy()
    if exe is None:
        return {"skip": "py-spy not installed (pip install py-spy)"}
    if target.pid is None:
        return {"skip": "no process"}
    slug = target.name.replace("+", "-")
    collapsed = out_dir / f"profile-{slug}-{stamp}.txt"
    argv = [
        exe,
        "record",
        "--pid",
        str(target.pid),
        "--rate",
        "200",
        "--nonblocking",
        "--duration",
        str(int(seconds) + 1),
        "--format",
        "raw",
        "-o",
        str(collapsed),
    ]
    spy = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    result: list[loadgen.WrkResult] = []
    runner = threading.Thread(
        target=lambda: result.append(loadgen.run_wrk(target, connections, seconds))
    )
    runner.start()
    runner.join()
    _, err = spy.communicate(timeout=seconds + 30)
    if not collapsed.exists():
        return {"skip": f"py-spy failed: {err.decode(errors='replace')[-300:]}"}
    summary = summarize_collapsed(collapsed)
    summary["file"] = str(collapsed)
    summary["wrk_under_profiler"] = loadgen.as_dict(result[0]) if result else None
    return summary


def _frame_name(frame: str) -> str:
    """``"fn (pkg/module.py:123)"`` -> ``"fn (pkg/module.py)"``: one entry per function."""
    name, _, where = frame.partition(" (")
    return f"{name} ({where.rstrip(')').rsplit(':', 1)[0]})"


def _area(frame: str) -> str:
    """A coarse bucket for a leaf frame: budgetproxy's module, else the library or file."""
    path = frame.partition(" (")[2].rstrip(")").rsplit(":", 1)[0]
    if path.startswith("budgetproxy/"):
        return path
    return path.split("/", 1)[0] if "/" in path else path


def summarize_collapsed(path: Path, top: int = 20) -> dict[str, Any]:
    """Self and inclusive sample shares per function, and self share per library/module."""
    self_counts: Counter[str] = Counter()
    incl_counts: Counter[str] = Counter()
    area_counts: Counter[str] = Counter()
    total = idle = 0
    for line in path.read_text().splitlines():
        stack, _, count_s = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_s)
        frames = [f for f in stack.split(";") if not f.startswith(("process ", "thread "))]
        total += count
        if not frames:
            continue
        leaf = frames[-1]
        if leaf.startswith(
            ("select (", "poll (", "run_forever (", "_run_once (")
        ) or leaf.startswith("epoll"):
            idle += count
        self_counts[_frame_name(leaf)] += count
        area_counts[_area(leaf)] += count
        for frame in set(frames):
            incl_counts[_frame_name(frame)] += count
    busy = max(1, total - idle)

    def share(counter: Counter[str], n: int) -> list[tuple[str, float]]:
        return [(k, round(100 * v / busy, 1)) for k, v in counter.most_common(n)]

    return {
        "samples": total,
        "idle_samples": idle,
        "self_pct_of_busy": share(self_counts, top),
        "inclusive_pct_of_busy": share(incl_counts, top * 2),
        "self_pct_by_area": share(area_counts, top),
    }


def print_summary(name: str, summary: dict[str, Any], top: int = 15) -> None:
    if "skip" in summary:
        print(f"profile {name}: skipped ({summary['skip']})")
        return
    print(
        f"\nProfile of {name} at c=32 ({summary['samples']} samples, "
        f"{summary['idle_samples']} idle; shares are of busy samples)"
    )
    print("  self time by library / module:")
    for area, pct in summary["self_pct_by_area"][:top]:
        print(f"    {pct:5.1f}%  {area}")
    print("  inclusive time, top functions:")
    for fn, pct in summary["inclusive_pct_of_busy"][: top * 2]:
        print(f"    {pct:5.1f}%  {fn}")
    print(f"  collapsed stacks: {summary['file']}")
