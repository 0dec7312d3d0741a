"""The README's figure (examples/demo-report.png) is the full demo's, drawn by the current code.

The full demo takes minutes, so it does not run here. Instead: the committed data the figure is
drawn from (examples/demo-report.json, written by `budgetproxy demo --figure`) must be a full
run of the demo as it is planned now; the PNG must carry the digest of the page the current
chart code draws from that data; and the numbers the README quotes must be that run's. Any
change to the demo's plan, the charts or the README's numbers without redrawing fails here:

    budgetproxy demo --out ./budgetproxy-demo --figure examples/demo-report.png
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from budgetproxy.demo.figure import (
    FIGURE_K,
    SOURCE_KEY,
    figure_data,
    figure_page,
    png_size,
    png_text,
    render_png,
    source_digest,
    with_text,
)
from budgetproxy.demo.run import DemoSettings, plan_episodes

ROOT = Path(__file__).resolve().parents[2]
PNG, DATA = ROOT / "examples" / "demo-report.png", ROOT / "examples" / "demo-report.json"
REDRAW = "redraw it: budgetproxy demo --out ./budgetproxy-demo --figure examples/demo-report.png"


@pytest.fixture(scope="module")
def data() -> dict[str, object]:
    loaded: dict[str, object] = json.loads(DATA.read_text(encoding="utf-8"))
    return loaded


def test_the_data_is_a_full_run_of_the_demo_as_planned_now(data: dict[str, object]) -> None:
    full = DemoSettings(out=Path("unused"))
    settings = data["settings"]
    assert isinstance(settings, dict) and settings["seed"] == full.seed
    assert settings["k"] == list(full.analysis_k)
    episodes = data["episodes"]
    assert isinstance(episodes, dict)
    assert episodes["used"] == len(plan_episodes(full)), REDRAW
    cells = data["pass_at"]
    assert isinstance(cells, list) and {c["k"] for c in cells} == set(FIGURE_K)
    assert {c["n_tasks"] for c in cells if c["k"] == 1} == {len(full.tasks)}, REDRAW


def test_the_png_is_the_current_drawing_of_that_data(data: dict[str, object]) -> None:
    png = PNG.read_bytes()
    page, size = figure_page(data)
    assert png_text(png).get(SOURCE_KEY) == source_digest(page), REDRAW
    assert png_size(png) == size


def test_the_readmes_numbers_are_that_runs(data: dict[str, object]) -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "![Pass@(K,T) curves from the demo's report](examples/demo-report.png)" in readme
    quoted = readme.split("From one full run (seed 0):", 1)[1].split("```", 2)[1]
    intervals = re.findall(r"([+-]\d\.\d\d) \[([+-]\d\.\d\d), ([+-]\d\.\d\d)\]", quoted)
    assert len(intervals) >= 6
    rows = [*data["compare"], *data["token_arm"]["compare"]]  # type: ignore[index, misc]
    run = {(f"{r['diff']:+.2f}", f"{r['ci_low']:+.2f}", f"{r['ci_high']:+.2f}") for r in rows}
    assert set(intervals) <= run, REDRAW


def test_the_figure_command_draws_from_pass_at_json_in_chromium(tmp_path: Path,
                                                                data: dict[str, object]) -> None:
    from budgetproxy.demo.figure import main

    source = tmp_path / "data.json"
    source.write_text(json.dumps(data))
    assert main([str(source), str(tmp_path / "figure.png")]) == 0
    png = (tmp_path / "figure.png").read_bytes()
    page, size = figure_page(data)
    assert png_size(png) == size and png_text(png)[SOURCE_KEY] == source_digest(page)
    # figure_data keeps only what the figure and the README's claims read
    again = figure_data({**data, "pass_at": [*data["pass_at"], {"k": 2}]})  # type: ignore[list-item]
    assert again["pass_at"] == data["pass_at"] and again["compare"] == data["compare"]


def test_png_text_chunks_round_trip(tmp_path: Path) -> None:
    page = "<!doctype html><p>x</p>"
    render_png(page, (120, 80), tmp_path / "x.png")
    png = (tmp_path / "x.png").read_bytes()
    assert png_size(png) == (120, 80)
    assert png_text(png) == {SOURCE_KEY: source_digest(page)}
    assert png_text(with_text(png, "k", "v"))["k"] == "v"
    with pytest.raises(ValueError, match="not a PNG"):
        with_text(b"GIF89a", "k", "v")
