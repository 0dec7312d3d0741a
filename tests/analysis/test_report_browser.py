"""The HTML report in a real headless Chromium: one-task bars hatched, one x scale per
comparison, the task table's links."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from browser_support import chromium
from records_support import episode_record

from budgetproxy.cli import main


def test_hatched_bars_and_shared_difference_scales_render(tmp_path: Path) -> None:
    won: dict[str, Any] = {"outcome": "success", "end_reason": "success", "success_turn": 2}
    records = [
        episode_record(f"{arm}{t}-{i}", task_id=f"t{t}", disclosure=arm, budget=b, max_turns=20,
                       tier=f"{5 * b}%", **(won if i < t % 3 + (arm == "disclosed") else {}))
        for t in range(12) for arm in ("hidden", "disclosed") for i in range(4)
        for b in (5, 20)
    ] + [episode_record("lone", task_id="t0", budget=7, max_turns=20, tier="35%", **won)]
    logs = tmp_path / "log.jsonl"
    logs.write_text("".join(json.dumps(r) + "\n" for r in records))
    report = tmp_path / "report.html"
    assert main(["analyze", str(logs), "--k", "1,4", "--compare", "disclosure=disclosed,hidden",
                 "--report", str(report), "--resamples", "100"]) == 0
    with chromium() as browser:
        tab = browser.new_tab()
        tab.goto(report.as_uri())
        # the 35% bar rests on one task: its fill is the hatch pattern, which resolves
        bar = tab.eval("""(() => {
            const r = [...document.querySelectorAll('rect')].find(
                r => (r.querySelector('title') || {}).textContent?.startsWith('35%, hidden'));
            const fill = r.getAttribute('fill');
            const id = fill.slice(5, -1);
            const p = document.getElementById(id);
            return [fill, p && p.tagName, r.getBBox().height > 0,
                    r.querySelector('title').textContent];
        })()""")
        assert bar[0].startswith("url(#hatch-") and bar[1] == "pattern" and bar[2], bar
        assert "n = 1 task, no interval" in bar[3]
        # the two K charts of the comparison: "+0" sits at the same x in both, as do ±50
        ticks = tab.eval("""[...document.querySelectorAll('svg[aria-label^="Pass@("]')]
            .filter(s => s.getAttribute('aria-label').includes('−'))
            .map(s => [...s.querySelectorAll('text')]
                .filter(t => /^[+-]\\d+$/.test(t.textContent))
                .map(t => t.textContent + '@' + t.getAttribute('x')))""")
        assert len(ticks) == 2 and ticks[0] == ticks[1] and len(ticks[0]) >= 3, ticks
        assert tab.eval("document.querySelector('h2:last-of-type').textContent") == "Tasks"
        png = tab.screenshot()
        assert png.startswith(b"\x89PNG")
    assert not browser.console, browser.console
