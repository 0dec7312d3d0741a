"""bench/report.py: paired ratios over interleaved rounds, and the noisy-machine warning."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import report  # noqa: E402


def _rows(base: list[float], row: list[float]) -> dict[str, dict[str, Any]]:
    def wrk(rps: list[float]) -> dict[str, Any]:
        runs = [{"rps": r, "cpu_us_per_req": 1e6 / r} for r in rps]
        return {"wrk": {"c32": {"rps": sorted(rps)[len(rps) // 2], "runs": runs}}}

    return {"base": wrk(base), "row": wrk(row)}


def test_ratios_are_medians_of_each_rounds_pair_with_their_range() -> None:
    # The machine slowed down in round 2; each pair still shows the row at 0.9x.
    summary = report.summarize(_rows([1000, 500, 1000], [900, 450, 900]), [32], "base")
    row = summary["row"]
    assert row["rps_vs_baseline_c32"] == 0.9
    assert row["rps_vs_baseline_c32_range"] == [0.9, 0.9]
    assert row["cpu_capacity_vs_baseline_c32"] == 0.9
    assert "rps_vs_baseline_c32_range" not in summary["base"]
    assert report.noise_note(summary, [32]) is None


def test_rounds_that_disagree_are_called_noisy() -> None:
    summary = report.summarize(_rows([1000, 1000, 1000], [700, 950, 1250]), [32], "base")
    assert summary["row"]["rps_vs_baseline_c32"] == 0.95
    note = report.noise_note(summary, [32])
    assert note is not None
    assert "row's rounds ranged 0.70x-1.25x at c=32" in note
    assert "bench/overhead.py" in note


def test_the_spread_is_judged_relative_to_the_ratio() -> None:
    # +-3% around 2.66x (the upstream alone against the forwarder) is not noise.
    summary = report.summarize(_rows([1000, 1000, 1000], [2580, 2660, 2740]), [32], "base")
    assert report.noise_note(summary, [32]) is None


def test_rows_at_a_git_revision_run_that_revisions_package(tmp_path: Path) -> None:
    """`budgetproxy+episodes@REV` rows compare builds side by side in one run."""
    import targets as tg

    assert tg.split_revision("budgetproxy+episodes@main~3") == ("budgetproxy+episodes", "main~3")
    assert tg.split_revision("forwarder") == ("forwarder", None)
    assert tg.is_budgetproxy_row("budgetproxy+redis@HEAD")
    assert not tg.is_budgetproxy_row("budgetproxy@") and not tg.is_budgetproxy_row("nginx@HEAD")
    src = tg.source_of("HEAD", tmp_path)
    assert (src / "budgetproxy" / "__init__.py").is_file()
    assert tg.source_of("HEAD", tmp_path) == src  # unpacked once per run
    with pytest.raises(SystemExit, match="unknown git revision"):
        tg.source_of("no-such-revision-xyz", tmp_path)


def test_throughput_targets_are_the_issues_floors() -> None:
    summary = {"forwarder": {"rps_vs_baseline_c32": 1.0},
               "budgetproxy+episodes": {"rps_vs_baseline_c32": 0.85},
               "budgetproxy+redis": {"rps_vs_baseline_c32": 0.81}}
    lines = report.verdicts(summary)
    assert "budgetproxy+episodes: 0.85x forwarder req/s at c=32 (target >= 0.9x) MISSED" in lines
    assert "budgetproxy+redis: 0.81x forwarder req/s at c=32 (target >= 0.8x) MET" in lines


def test_added_ttft_is_judged_over_the_forwarders_on_every_api() -> None:
    summary = {"forwarder": {"ttft_overhead_p50_ms": 1.4},
               "budgetproxy+episodes": {"ttft_overhead_p50_ms": 2.0}}

    def streams(ttft: float) -> dict[str, Any]:
        return {"streams": {"ttft_p50_ms": ttft}}

    api_rows = {"responses": {"direct": streams(3.0), "budgetproxy+episodes": streams(6.0)},
                "messages": {"direct": streams(3.0)}}
    chat, responses, messages = report.ttft_verdicts(summary, api_rows)
    assert chat.endswith("+0.60 ms over the forwarder's +1.40 ms (target <= 1 ms) MET")
    assert responses.startswith("budgetproxy+episodes TTFT on responses: +3.00 ms over direct")
    assert responses.endswith("MISSED")
    assert messages == ("budgetproxy+episodes TTFT on messages: not measured "
                        "(target <= 1 ms over the forwarder's)")
    assert report.ttft_verdicts(summary, api_rows, "other") == []


def test_a_row_with_errors_is_not_judged_on_its_ratio() -> None:
    summary = {"forwarder": {"rps_vs_baseline_c32": 1.0},
               "budgetproxy+redis": {"rps_vs_baseline_c32": 1.51, "errors_c32": 102682}}
    assert ("budgetproxy+redis: 102682 errors at c=32, ratio 1.51x not judged "
            "(target >= 0.8x forwarder) MISSED") in report.verdicts(summary)
    rows = {"forwarder": {"wrk": {"c32": {"rps": 10.0, "errors": 0}}},
            "row": {"wrk": {"c32": {"rps": 9.0, "errors": 3}}}}
    assert report.summarize(rows, [32])["row"]["errors_c32"] == 3


def test_a_verdict_whose_rounds_straddle_the_floor_says_so() -> None:
    summary = {"forwarder": {"rps_vs_baseline_c32": 1.0},
               "budgetproxy+episodes": {"rps_vs_baseline_c32": 0.92,
                                        "rps_vs_baseline_c32_range": [0.75, 1.62],
                                        "cpu_capacity_vs_baseline_c32": 0.71}}
    line = next(v for v in report.verdicts(summary) if v.startswith("budgetproxy+episodes"))
    assert line == ("budgetproxy+episodes: 0.92x forwarder req/s at c=32 (target >= 0.9x) MET "
                    "(rounds 0.75x-1.62x: not settled); by CPU time per request 0.71x MISSED")


def test_feature_rows_are_judged_against_their_own_baselines() -> None:
    """bench/instructions.py: budgets beside the episodes row, capture beside the row that
    gets the same answers; a row measured without its baseline is not judged."""
    import instructions

    def row(n: int) -> dict[str, int]:
        return {"instructions_per_request": n}

    lines = instructions.feature_verdicts({
        "budgetproxy+episodes": row(600_000), "bp+episodes-tokens": row(630_000),
        "bp+episodes-cost": row(631_000), "bp+episodes-tokenfields": row(800_000),
        "bp+episodes-capture": row(1_000_000)})
    assert lines == [
        "bp+episodes-tokens: 1.050x budgetproxy+episodes's instructions per call "
        "(target <= 1.05x) MET",
        "bp+episodes-cost: 1.052x budgetproxy+episodes's instructions per call "
        "(target <= 1.05x) MISSED",
        "bp+episodes-capture: 1.250x bp+episodes-tokenfields's instructions per call "
        "(target <= 1.05x) MISSED"]
    assert instructions.feature_verdicts({"bp+episodes-capture": row(1)}) == []
