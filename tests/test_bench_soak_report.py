"""The soak's memory verdict reads per-minute medians: the heap's trim sawtooth is no trend,
and a leak still is; the proxy's own heap readings are fitted beside it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import soak_report  # noqa: E402


def samples(leak_mib_per_h: float, minutes: int = 15,
            every_s: float = 5.0) -> list[dict[str, float]]:
    """RSS every 5 s: 300 MiB, a sawtooth of 0-24 MiB between trims (a trim every 40 s, out of
    step with the minutes), and a steady leak."""
    out = []
    for i in range(int(minutes * 60 / every_s)):
        t = i * every_s
        saw = 24.0 * ((t % 40.0) / 40.0)
        out.append({"t_s": t, "rss_mib": 300.0 + saw + leak_mib_per_h * t / 3600})
    return out


def test_the_trim_sawtooth_is_no_peak() -> None:
    """Samples peak at the top of each tooth; the minutes' medians sit level."""
    rows = samples(0.0)
    minutes = [v for _, v in soak_report.minute_medians(rows, "rss_mib")]
    assert max(r["rss_mib"] for r in rows) - 300.0 > 20.0
    assert max(minutes) - min(minutes) < 8.0


def test_a_leak_shows_in_the_minutes_and_the_fit() -> None:
    rows = samples(240.0)  # 4 MiB a minute
    minutes = [v for _, v in soak_report.minute_medians(rows, "rss_mib")]
    assert max(minutes) - sorted(minutes)[len(minutes) // 2] > 16.0
    half = [r for r in rows if r["t_s"] >= 450]
    slope, _, err = soak_report.fit_line([r["t_s"] / 3600 for r in half],
                                         [r["rss_mib"] for r in half])
    assert slope - 2 * err > 4.0


def test_minutes_with_few_samples_are_left_out() -> None:
    rows = [{"t_s": 0.0, "rss_mib": 1.0}, {"t_s": 65.0, "rss_mib": 2.0},
            {"t_s": 70.0, "rss_mib": 4.0}, {"t_s": 75.0, "rss_mib": 3.0}]
    assert soak_report.minute_medians(rows, "rss_mib") == [(90, 3.0)]


def test_the_heap_readings_tell_kept_memory_from_free_space() -> None:
    """Memory in use level while the free space between blocks grows: two slopes, apart; a
    run whose proxy gave no reading has none."""
    rows = [{"t_s": 60.0 * m, "heap_in_use_mib": 50.0 + (m % 2),
             "heap_free_mib": 20.0 + m / 6} for m in range(30)]
    heap = soak_report.heap_trends(rows)
    in_use, free = heap["heap_in_use_mib"], heap["heap_free_mib"]
    assert abs(in_use["slope_mib_per_h"]) < 1.0
    assert free["slope_mib_per_h"] == 10.0 and free["first"] == 20.0
    assert free["last"] == pytest.approx(24.83, abs=0.01)
    assert soak_report.heap_trends([{"t_s": 1.0, "heap_in_use_mib": None}] * 5) == {}
