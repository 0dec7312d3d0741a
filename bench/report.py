"""Turn raw measurements into the ratio table, the target verdicts and the results JSON."""

from __future__ import annotations

from typing import Any

BASELINE = "forwarder"
DIRECT = "direct"
# Throughput targets at concurrency 32, relative to the minimal forwarder (DESIGN.md).
TARGETS = {"budgetproxy": 0.9, "budgetproxy+episodes": 0.8, "budgetproxy+redis": 0.6}


def _fmt(value: float | None, spec: str = ".2f", suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def summarize(rows: dict[str, dict[str, Any]], levels: list[int]) -> dict[str, dict[str, Any]]:
    """Per target: added latency and throughput, absolute and relative to the baseline."""
    direct = rows.get(DIRECT, {}).get("wrk", {})
    base = rows.get(BASELINE, {}).get("wrk", {})
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
                summary["added_vs_forwarder"] = round(added / base_added, 2)
        for c in levels:
            key = f"c{c}"
            if key in wrk and key in base and base[key]["rps"]:
                summary[f"rps_vs_forwarder_{key}"] = round(wrk[key]["rps"] / base[key]["rps"], 3)
            cpu = wrk.get(key, {}).get("cpu_us_per_req")
            base_cpu = base.get(key, {}).get("cpu_us_per_req")
            if cpu and base_cpu:
                # Requests per CPU-second relative to the forwarder: the throughput ratio a
                # dedicated core would show, and robust to other load on the machine.
                summary[f"cpu_capacity_vs_forwarder_{key}"] = round(base_cpu / cpu, 3)
        stream = row.get("streams")
        base_stream = rows.get(BASELINE, {}).get("streams")
        direct_stream = rows.get(DIRECT, {}).get("streams")
        if stream and direct_stream and stream.get("ttft_p50_ms") is not None:
            ttft = stream["ttft_p50_ms"] - direct_stream["ttft_p50_ms"]
            gap = stream["gap_p99_ms"] - direct_stream["gap_p99_ms"]
            summary["ttft_overhead_p50_ms"] = round(ttft, 3)
            summary["gap_overhead_p99_ms"] = round(gap, 3)
            if base_stream and base_stream.get("ttft_p50_ms") is not None:
                base_ttft = base_stream["ttft_p50_ms"] - direct_stream["ttft_p50_ms"]
                if base_ttft > 0:
                    summary["ttft_overhead_vs_forwarder"] = round(ttft / base_ttft, 2)
        out[name] = summary
    return out


def verdicts(summary: dict[str, dict[str, Any]]) -> list[str]:
    lines = []
    for name, floor in TARGETS.items():
        s = summary.get(name, {})
        ratio = s.get("rps_vs_forwarder_c32")
        if ratio is None:
            lines.append(f"{name}: not measured (target >= {floor}x forwarder at c=32)")
            continue
        verdict = "MET" if ratio >= floor else "MISSED"
        line = f"{name}: {ratio:.2f}x forwarder req/s at c=32 (target >= {floor}x) {verdict}"
        cpu = s.get("cpu_capacity_vs_forwarder_c32")
        if cpu is not None:
            cpu_verdict = "MET" if cpu >= floor else "MISSED"
            line += f"; by CPU time per request {cpu:.2f}x {cpu_verdict}"
        lines.append(line)
    return lines


def table(
    rows: dict[str, dict[str, Any]], summary: dict[str, dict[str, Any]], levels: list[int]
) -> str:
    head = ["target", "c1 p50", "added p50", "added/fwd"]
    for c in [c for c in levels if c != 1]:
        head += [f"c{c} req/s", "/fwd", f"c{c} p99"]
        if c == 32:
            head += ["CPU/req", "/fwd"]
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
            _fmt(s.get("added_vs_forwarder"), ".2f", "x"),
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
                _fmt(s.get(f"rps_vs_forwarder_c{c}"), ".2f", "x"),
                _fmt(r.get("p99_ms"), ".1f", "ms"),
            ]
            if c == 32:
                line += [
                    _fmt(r.get("cpu_us_per_req"), ".0f", "us"),
                    _fmt(s.get("cpu_capacity_vs_forwarder_c32"), ".2f", "x"),
                ]
        line.append(str(sum(r.get("errors", 0) for r in wrk.values())))
        lines.append(line)
    return _grid(lines)


def stream_table(rows: dict[str, dict[str, Any]], summary: dict[str, dict[str, Any]]) -> str:
    lines = [
        ["target", "streams ok", "TTFT p50", "TTFT +", "+/fwd", "gap p50", "gap p99", "gap p99 +"]
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
                _fmt(s.get("ttft_overhead_vs_forwarder"), ".2f", "x"),
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
