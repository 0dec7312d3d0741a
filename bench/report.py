"""Turn raw measurements into the ratio table, the target verdicts and the results JSON."""

from __future__ import annotations

import statistics
from typing import Any

BASELINE = "forwarder"
DIRECT = "direct"
# Throughput targets at concurrency 32, relative to the minimal forwarder: forwarding only
# (DESIGN.md), episodes on the disclosed arm and the Redis store (the performance issue).
TARGETS = {"budgetproxy": 0.9, "budgetproxy+episodes": 0.9, "budgetproxy+redis": 0.8}
# Time to first token the episodes row may add over the forwarder's own (10 streams, p50),
# on chat and on the Responses and Messages rows (--apis).
TTFT_TARGET_ROW = "budgetproxy+episodes"
TTFT_TARGET_MS = 1.0


def _fmt(value: float | None, spec: str = ".2f", suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def _paired_ratio(
    row: dict[str, Any], base: dict[str, Any], key: str, invert: bool = False
) -> float | None:
    """Median over rounds of row/base (base/row with `invert`) for one wrk measure.

    Rounds are interleaved, so each round's pair ran within seconds of each other: the ratio
    of a pair cancels the drift of a shared machine that a ratio of medians keeps."""
    ratios = _paired_ratios(row, base, key, invert)
    return round(statistics.median(ratios), 3) if ratios else None


def _paired_ratios(
    row: dict[str, Any], base: dict[str, Any], key: str, invert: bool = False
) -> list[float]:
    """Each round's row/base (base/row with `invert`) for one wrk measure."""
    runs, base_runs = row.get("runs"), base.get("runs")
    pairs: list[tuple[Any, Any]] = (
        [(r.get(key), b.get(key)) for r, b in zip(runs, base_runs, strict=True)]
        if runs and base_runs and len(runs) == len(base_runs)
        else [(row.get(key), base.get(key))]
    )
    # A round the row answered nothing in is a ratio of 0, not a round to skip; CPU per
    # request (`invert`) has no value then, and a baseline without one compares nothing.
    return [
        (b / v if invert else v / b)
        for v, b in pairs
        if b and v is not None and (v or not invert)
    ]


def summarize(
    rows: dict[str, dict[str, Any]], levels: list[int], baseline: str = BASELINE
) -> dict[str, dict[str, Any]]:
    """Per target: added latency and throughput, absolute and relative to the baseline row."""
    direct = rows.get(DIRECT, {}).get("wrk", {})
    base = rows.get(baseline, {}).get("wrk", {})
    direct_p50 = direct.get("c1", {}).get("p50_ms")
    base_added = None
    if direct_p50 is not None and "c1" in base:
        base_added = base["c1"]["p50_ms"] - direct_p50
    out: dict[str, dict[str, Any]] = {}
    for name, row in rows.items():
        wrk = row.get("wrk", {})
        summary: dict[str, Any] = {}
        if "c1" in wrk and direct_p50 is not None:
            added = wrk["c1"]["p50_ms"] - direct_p50
            summary["added_p50_ms"] = round(added, 3)
            summary["added_p99_ms"] = round(wrk["c1"]["p99_ms"] - direct["c1"]["p99_ms"], 3)
            if base_added and base_added > 0:
                summary["added_vs_baseline"] = round(added / base_added, 2)
        for c in levels:
            key = f"c{c}"
            if key in wrk and key in base:
                ratios = _paired_ratios(wrk[key], base[key], "rps")
                if ratios:
                    summary[f"rps_vs_baseline_{key}"] = round(statistics.median(ratios), 3)
                if len(ratios) > 1 and name != baseline:
                    summary[f"rps_vs_baseline_{key}_range"] = [round(min(ratios), 3),
                                                               round(max(ratios), 3)]
                # Requests per CPU-second relative to the baseline: the throughput ratio a
                # dedicated core would show, and robust to other load on the machine.
                cpu = _paired_ratio(wrk[key], base[key], "cpu_us_per_req", invert=True)
                if cpu is not None:
                    summary[f"cpu_capacity_vs_baseline_{key}"] = cpu
            if key in wrk:
                summary[f"errors_{key}"] = wrk[key].get("errors", 0)
        stream = row.get("streams")
        base_stream = rows.get(baseline, {}).get("streams")
        direct_stream = rows.get(DIRECT, {}).get("streams")
        if stream and direct_stream and stream.get("ttft_p50_ms") is not None:
            ttft = stream["ttft_p50_ms"] - direct_stream["ttft_p50_ms"]
            gap = stream["gap_p99_ms"] - direct_stream["gap_p99_ms"]
            summary["ttft_overhead_p50_ms"] = round(ttft, 3)
            summary["gap_overhead_p99_ms"] = round(gap, 3)
            if base_stream and base_stream.get("ttft_p50_ms") is not None:
                base_ttft = base_stream["ttft_p50_ms"] - direct_stream["ttft_p50_ms"]
                if base_ttft > 0:
                    summary["ttft_overhead_vs_baseline"] = round(ttft / base_ttft, 2)
        out[name] = summary
    return out


# Rounds whose paired req/s ratios span more than this share of their median cannot tell
# apart rows a few percent apart: the machine's other load moved between the runs of a pair.
NOISY_SPREAD = 0.15


def noise_note(summary: dict[str, dict[str, Any]], levels: list[int]) -> str | None:
    """A warning when the rounds disagree too much for the medians to settle small costs."""
    worst: tuple[float, str, int, list[float]] | None = None
    for name, s in summary.items():
        for c in levels:
            span = s.get(f"rps_vs_baseline_c{c}_range")
            median = s.get(f"rps_vs_baseline_c{c}")
            if not span or not median:
                continue
            spread = (span[1] - span[0]) / median  # relative: `direct` runs at ~2.7x
            if worst is None or spread > worst[0]:
                worst = (spread, name, c, span)
    if worst is None or worst[0] <= NOISY_SPREAD:
        return None
    _, name, c, (low, high) = worst
    return (f"noisy machine: {name}'s rounds ranged {low:.2f}x-{high:.2f}x at c={c}; medians "
            f"cannot separate rows a few percent apart. For small costs, load the rows together "
            f"(bench/overhead.py) or count instructions (bench/instructions.py).")


def verdicts(summary: dict[str, dict[str, Any]], baseline: str = BASELINE) -> list[str]:
    """The DESIGN.md throughput targets; they are against the forwarder, so only with that
    baseline."""
    if baseline != BASELINE:
        return [f"targets not judged: ratios are against {baseline}, not the {BASELINE}"]
    if "rps_vs_baseline_c32" not in summary.get(BASELINE, {}):
        return [f"targets not judged: no {BASELINE} row measured at c=32"]
    lines = []
    for name, floor in TARGETS.items():
        s = summary.get(name, {})
        ratio = s.get("rps_vs_baseline_c32")
        if ratio is None:
            lines.append(f"{name}: not measured (target >= {floor}x forwarder at c=32)")
            continue
        errors = s.get("errors_c32", 0)
        if errors:  # refusals and failures are answered fast: they would pass for capacity
            lines.append(f"{name}: {errors} errors at c=32, ratio {ratio:.2f}x not judged "
                         f"(target >= {floor}x forwarder) MISSED")
            continue
        verdict = "MET" if ratio >= floor else "MISSED"
        line = f"{name}: {ratio:.2f}x forwarder req/s at c=32 (target >= {floor}x) {verdict}"
        span = s.get("rps_vs_baseline_c32_range")
        if span and span[0] < floor <= span[1]:
            line += f" (rounds {span[0]:.2f}x-{span[1]:.2f}x: not settled)"
        cpu = s.get("cpu_capacity_vs_baseline_c32")
        if cpu is not None:
            cpu_verdict = "MET" if cpu >= floor else "MISSED"
            line += f"; by CPU time per request {cpu:.2f}x {cpu_verdict}"
        lines.append(line)
    return lines


def ttft_verdicts(
    summary: dict[str, dict[str, Any]], api_rows: dict[str, dict[str, Any]],
    baseline: str = BASELINE,
) -> list[str]:
    """The added-TTFT target: the episodes row's TTFT over direct's, minus the forwarder's on
    chat. The forwarder serves chat only, so on Responses and Messages (each against direct
    on its own API) the forwarder's chat figure is the allowance's base too."""
    if baseline != BASELINE:
        return []
    fwd = summary.get(BASELINE, {}).get("ttft_overhead_p50_ms")
    if fwd is None:
        return [f"TTFT target not judged: no {BASELINE} stream row"]
    lines = []
    chat = summary.get(TTFT_TARGET_ROW, {}).get("ttft_overhead_p50_ms")
    added: dict[str, float | None] = {"chat": chat}
    for api, by_target in api_rows.items():
        direct = by_target.get(DIRECT, {}).get("streams", {}).get("ttft_p50_ms")
        row = by_target.get(TTFT_TARGET_ROW, {}).get("streams", {}).get("ttft_p50_ms")
        added[api] = None if direct is None or row is None else row - direct
    for api, over_direct in added.items():
        if over_direct is None:
            lines.append(f"{TTFT_TARGET_ROW} TTFT on {api}: not measured "
                         f"(target <= {TTFT_TARGET_MS:g} ms over the {BASELINE}'s)")
            continue
        over = over_direct - fwd
        verdict = "MET" if over <= TTFT_TARGET_MS else "MISSED"
        lines.append(f"{TTFT_TARGET_ROW} TTFT on {api}: {over_direct:+.2f} ms over direct, "
                     f"{over:+.2f} ms over the {BASELINE}'s {fwd:+.2f} ms "
                     f"(target <= {TTFT_TARGET_MS:g} ms) {verdict}")
    return lines


def table(
    rows: dict[str, dict[str, Any]], summary: dict[str, dict[str, Any]], levels: list[int],
    baseline: str = BASELINE,
) -> str:
    per = "/fwd" if baseline == BASELINE else "/base"
    head = ["target", "c1 p50", "added p50", f"added{per}"]
    for c in [c for c in levels if c != 1]:
        head += [f"c{c} req/s", per, f"c{c} p99"]
        if c == 32:
            head += ["CPU/req", per]
    head += ["errors"]
    lines = [head]
    for name, row in rows.items():
        if row.get("skip"):
            lines.append([name, f"skipped: {row['skip'][:110]}"])
            continue
        wrk, s = row.get("wrk", {}), summary.get(name, {})
        c1 = wrk.get("c1", {})
        line = [
            name,
            _fmt(c1.get("p50_ms"), ".2f", "ms"),
            _fmt(s.get("added_p50_ms"), ".3f", "ms"),
            _fmt(s.get("added_vs_baseline"), ".2f", "x"),
        ]
        for c in [c for c in levels if c != 1]:
            r = wrk.get(f"c{c}", {})
            if r.get("requests") == 0:
                line += [f"none in {r['seconds']:.0f}s", "-", "-"]
                if c == 32:
                    line += ["-", "-"]
                continue
            line += [
                _fmt(r.get("rps"), ".0f"),
                _fmt(s.get(f"rps_vs_baseline_c{c}"), ".2f", "x"),
                _fmt(r.get("p99_ms"), ".1f", "ms"),
            ]
            if c == 32:
                line += [
                    _fmt(r.get("cpu_us_per_req"), ".0f", "us"),
                    _fmt(s.get("cpu_capacity_vs_baseline_c32"), ".2f", "x"),
                ]
        line.append(str(sum(r.get("errors", 0) for r in wrk.values())))
        lines.append(line)
    return _grid(lines)


def stream_table(
    rows: dict[str, dict[str, Any]], summary: dict[str, dict[str, Any]], baseline: str = BASELINE
) -> str:
    per = "+/fwd" if baseline == BASELINE else "+/base"
    lines = [
        ["target", "streams ok", "TTFT p50", "TTFT +", per, "gap p50", "gap p99", "gap p99 +"]
    ]
    for name, row in rows.items():
        st = row.get("streams")
        if not st:
            continue
        s = summary.get(name, {})
        lines.append(
            [
                name,
                f"{st['completed']}/{st['streams']}",
                _fmt(st.get("ttft_p50_ms"), ".2f", "ms"),
                _fmt(s.get("ttft_overhead_p50_ms"), ".2f", "ms"),
                _fmt(s.get("ttft_overhead_vs_baseline"), ".2f", "x"),
                _fmt(st.get("gap_p50_ms"), ".2f", "ms"),
                _fmt(st.get("gap_p99_ms"), ".2f", "ms"),
                _fmt(s.get("gap_overhead_p99_ms"), ".2f", "ms"),
            ]
        )
    return _grid(lines) if len(lines) > 1 else ""


def slow_table(rows: dict[str, dict[str, Any]]) -> str:
    lines = [
        ["target", "streams", "completed", "dropped", "RSS before", "RSS peak", "gap p99", "errors"]
    ]
    for name, row in rows.items():
        st = row.get("slow_streams")
        if not st:
            continue
        lines.append(
            [
                name,
                str(st["streams"]),
                str(st["completed"]),
                str(st["dropped"]),
                _fmt(st.get("rss_before_mib"), ".1f", " MiB"),
                _fmt(st.get("rss_peak_mib"), ".1f", " MiB"),
                _fmt(st.get("gap_p99_ms"), ".0f", "ms"),
                "; ".join(st.get("errors", []))[:60],
            ]
        )
    return _grid(lines) if len(lines) > 1 else ""


def _grid(lines: list[list[str]]) -> str:
    width = max(len(line) for line in lines)
    full = [line for line in lines if len(line) == width]
    widths = [max(len(line[i]) for line in full) for i in range(width)]
    out = []
    for n, line in enumerate(lines):
        if len(line) < width:
            out.append(f"{line[0]:<{widths[0]}}  " + " ".join(line[1:]))
        else:
            out.append(
                "  ".join(
                    cell.ljust(widths[i]) if i == 0 else cell.rjust(widths[i])
                    for i, cell in enumerate(line)
                )
            )
        if n == 0:
            out.append("-" * len(out[0]))
    return "\n".join(out)
