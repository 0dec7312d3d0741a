"""bench/run.py --apis: each API's stream events read, and its rows' table against direct."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import loadgen  # noqa: E402
import run  # noqa: E402


def test_api_rows_read_each_apis_stream_events_and_print_ratios_against_direct() -> None:
    assert loadgen._text_piece("responses", {"type": "response.output_text.delta",
                                             "delta": "x"}) == (True, False)
    assert loadgen._text_piece("responses", {"type": "response.completed"}) == (False, True)
    assert loadgen._text_piece("messages", {"type": "content_block_delta",
                                            "delta": {"type": "text_delta", "text": "x"}}) == (
        True, False)
    assert loadgen._text_piece("messages", {"type": "message_stop"}) == (False, True)
    table = run.api_table({
        "direct": {"c32": {"rps": 200.0, "p50_ms": 1.0, "errors": 0},
                   "streams": {"ttft_p50_ms": 3.0, "gap_p50_ms": 20.0, "completed": 10,
                               "streams": 10}},
        "budgetproxy": {"c32": {"rps": 100.0, "p50_ms": 2.0, "errors": 0},
                        "streams": {"ttft_p50_ms": 4.5, "gap_p50_ms": 20.1, "completed": 10,
                                    "streams": 10}}})
    row = table.splitlines()[2].split()
    assert row[:3] == ["budgetproxy", "100", "0.50x"] and "+1.50ms" in row
