"""The long-episode bench's verdict judges a row by its interval, never by its point alone,
and the growth with the history by the bounds both rows' intervals allow."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import long_episodes as le  # noqa: E402


def row(store: str, turns: int, ratio: float, low: float, high: float,
        chars: int = 400) -> dict[str, Any]:
    return {"store": store, "turns": turns, "message_chars": chars, "ratio": ratio,
            "ratio_95": [low, high]}


def test_a_row_is_met_only_when_its_whole_interval_is_under_the_target() -> None:
    lines = le.verdict([row("memory", 10, 1.45, 1.40, 1.49),
                        row("memory", 50, 1.48, 1.44, 1.53),
                        row("memory", 400, 1.60, 1.55, 1.66)])
    assert lines[0].endswith("against 1.5x: MET")
    assert lines[1].endswith("UNDECIDED (its interval holds 1.5x)")
    assert lines[2].endswith("MISSED")


def test_redis_rows_are_held_to_their_own_target() -> None:
    lines = le.verdict([row("redis", 10, 1.92, 1.82, 1.98)])
    assert lines == ["redis     10 turns   400 chars  1.92x [1.82, 1.98] against 2.0x: MET"]


def test_growth_compares_the_longest_history_with_the_shortest() -> None:
    flat = le.verdict([row("memory", 10, 1.54, 1.50, 1.58), row("memory", 400, 1.56, 1.52, 1.60),
                       row("memory", 50, 1.60, 1.55, 1.65, chars=4000)])
    assert flat[-1] == ("memory  growth 400 against 10 turns: 1.01 [0.96, 1.07] against 1.2: "
                        "MET")
    grown = le.verdict([row("memory", 10, 1.2, 1.15, 1.25), row("memory", 400, 1.8, 1.7, 1.9)])
    assert grown[-1].endswith("MISSED")
    wide = le.verdict([row("memory", 10, 1.3, 1.0, 1.6), row("memory", 400, 1.4, 1.1, 1.7)])
    assert wide[-1].endswith("UNDECIDED (its bounds hold 1.2)")


def test_instruction_rows_and_unknown_stores_get_no_verdict() -> None:
    counted = {"store": "memory", "turns": 10, "message_chars": 400, "ratio": 2.06}
    assert le.verdict([counted, row("sqlite", 10, 1.1, 1.0, 1.2)]) == []
