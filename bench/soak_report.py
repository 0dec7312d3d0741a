"""The soak run's figures: RSS trend after warm-up, latency, verdicts, table and SVG plot."""

from __future__ import annotations

import argparse
import math
import statistics
from html import escape
from typing import TYPE_CHECKING, Any

from targets import percentile

from budgetproxy.analysis.svg import Series, line_chart

if TYPE_CHECKING:
    from soak_agents import Load


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float, float]:
    """Least-squares slope, intercept and the slope's standard error."""
    n = len(xs)
    if n < 3:
        return 0.0, ys[0] if ys else 0.0, math.inf
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return 0.0, my, math.inf
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    intercept = my - slope * mx
    resid = sum((y - intercept - slope * x) ** 2 for x, y in zip(xs, ys, strict=True))
    return slope, intercept, math.sqrt(resid / (n - 2) / sxx)


def latency(load: Load, since_s: float) -> dict[str, Any]:
    pairs = load.all_latencies_ms
    values = sorted(pairs[i + 1] for i in range(0, len(pairs), 2) if pairs[i] >= since_s)
    return {"calls": len(values), "p50_ms": percentile(values, 50, 2),
            "p90_ms": percentile(values, 90, 2), "p99_ms": percentile(values, 99, 2),
            "p999_ms": percentile(values, 99.9, 2),
            "max_ms": round(values[-1], 2) if values else None}


def minute_medians(rows: list[dict[str, Any]], key: str) -> list[tuple[float, float]]:
    """(minute's middle in s, the median of `key` over its samples), for each whole minute.
    The heap is trimmed every few seconds (server.malloc_trim_s), so single samples swing by
    ~10 MiB between trims; a minute's median is what the process holds through them."""
    minutes: dict[int, list[dict[str, Any]]] = {}
    for r in rows:
        minutes.setdefault(int(r["t_s"] // 60), []).append(r)
    return [(60 * m + 30, statistics.median(r[key] for r in rs))
            for m, rs in sorted(minutes.items()) if len(rs) >= 3]


def heap_trends(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """glibc's heap inside the proxy over `rows` (its own reading, where it has one): what it
    keeps in use, and the free space between (fragmentation; resident or not as the trim left
    it), each as its first and last value and fitted slope."""
    heap = {}
    for key in ("heap_in_use_mib", "heap_free_mib"):
        points = [(r["t_s"] / 3600, r[key]) for r in rows if r.get(key) is not None]
        if len(points) >= 3:
            slope, _, err = fit_line([t for t, _ in points], [v for _, v in points])
            heap[key] = {"first": points[0][1], "last": points[-1][1],
                         "slope_mib_per_h": round(slope, 2),
                         "stderr_mib_per_h": round(err, 2) if math.isfinite(err) else None}
    return heap


def summarize(
    rows: list[dict[str, Any]], load: Load, warmup_s: float, duration_s: float,
    max_slope: float, max_excursion: float,
) -> dict[str, Any]:
    loaded = [r for r in rows if "calls_per_s" in r and not r.get("partial")]
    post = [r for r in loaded if r["t_s"] >= warmup_s] or loaded
    half = [r for r in loaded if r["t_s"] >= duration_s / 2] or loaded
    rss_post = [r["rss_mib"] for r in post]
    median = statistics.median(rss_post)
    slope, intercept, err = fit_line([r["t_s"] / 3600 for r in half],
                                     [r["rss_mib"] for r in half])
    anon_slope, _, _ = fit_line([r["t_s"] / 3600 for r in half], [r["anon_mib"] for r in half])
    heap = heap_trends(half)
    post_slope, _, _ = fit_line([r["t_s"] / 3600 for r in post], [r["rss_mib"] for r in post])
    # The peak is a minute's median: single samples swing between the heap's trims, and the
    # highest of hundreds of them says more about that swing than about the trend. (The slope
    # is fitted to every sample: minutes' medians would carry the same information in fewer
    # points.)
    post_minutes = [v for _, v in minute_medians(post, "rss_mib")] or rss_post
    excursion = max(post_minutes) - statistics.median(post_minutes)
    flat = slope <= max_slope and excursion <= max_excursion
    t = load.totals
    total = {"scheduled": t.scheduled, "ok": t.ok, "streams": t.streams,
             "rejected_403": t.rejected, "outcomes": t.outcomes, "errors": t.errors,
             "unsent": t.unsent}
    return {
        "rss": {
            "idle_mib": rows[0]["rss_mib"],
            "first_sample_mib": loaded[0]["rss_mib"] if loaded else None,
            "after_warmup_mib": post[0]["rss_mib"],
            "end_mib": loaded[-1]["rss_mib"] if loaded else None,
            "post_warmup_median_mib": round(median, 2),
            "post_warmup_max_mib": max(rss_post),
            "max_minus_median_mib": round(excursion, 2),  # of per-minute medians
            "sample_max_minus_median_mib": round(max(rss_post) - median, 2),
            "excursion_basis": "per-minute medians",
            "peak_hwm_mib": max(r["hwm_mib"] for r in rows),
            "slope_second_half_mib_per_h": round(slope, 2),
            "slope_stderr_mib_per_h": round(err, 2) if math.isfinite(err) else None,
            "anon_slope_second_half_mib_per_h": round(anon_slope, 2),
            "heap_second_half": heap,
            "slope_post_warmup_mib_per_h": round(post_slope, 2),
            "fit": {"from_s": half[0]["t_s"], "intercept_mib": round(intercept, 3),
                    "slope_mib_per_s": slope / 3600},
            "max_slope_mib_per_h": max_slope,
            "max_excursion_mib": max_excursion,
            "flat": flat,
        },
        "latency_post_warmup": latency(load, warmup_s),
        "latency_all": latency(load, 0.0),
        "calls": len(load.all_latencies_ms) // 2,
        **total,
        "episodes_started": load.episodes_started,
        "achieved_calls_per_s_post_warmup": round(
            statistics.fmean(r["calls_per_s"] for r in post), 1),
        "cpu_pct_post_warmup": round(statistics.fmean(r["cpu_pct"] for r in post), 1),
        "queue_depth_max": max((r["queue_depth"] or 0) for r in rows),
        "trajectory_mib_end": loaded[-1]["trajectory_mib"] if loaded else None,
        "warmup_s": warmup_s,
    }


def verdicts(summary: dict[str, Any], records: dict[str, Any]) -> list[str]:
    rss = summary["rss"]
    flat = "MET" if rss["flat"] else "MISSED"
    lost = "MET" if records["ok"] else "MISSED"
    answered = records["turns_answered_200"]
    faithful = "MET" if not records["turns_mislabelled"] else "MISSED"
    errors = "MET" if not summary["errors"] and not summary["unsent"] else "MISSED"
    return [
        f"memory flat after warm-up: "
        f"{rss['slope_second_half_mib_per_h']:+.1f} ± {rss['slope_stderr_mib_per_h']} MiB/h "
        f"over the second half (limit {rss['max_slope_mib_per_h']:g}), the highest minute "
        f"{rss['max_minus_median_mib']:.1f} MiB above their median "
        f"(limit {rss['max_excursion_mib']:g}) {flat}",
        f"nothing lost: {answered - records['turns_missing']}/{answered} answered turns have "
        f"a record, {records['episode_records']} episode records for "
        f"{records['episodes_expected']} ended episodes ({records['episodes_missing']} missing, "
        f"{records['episodes_duplicated']} duplicated, {records['episodes_wrong_end_reason']} "
        f"wrong end reason) {lost}",
        f"records say what the client got: {records['turns_mislabelled']} answered turns "
        f"logged as {', '.join(records['turn_records_other']) or 'not ok'} {faithful}",
        f"no failed calls: {summary['errors']} errors, {summary['unsent']} calls due with no "
        f"agent ready {errors}",
    ]


def table(summary: dict[str, Any], records: dict[str, Any]) -> str:
    rss, lat = summary["rss"], summary["latency_post_warmup"]
    rows = [
        ("RSS idle / after warm-up / end", f"{rss['idle_mib']:.1f} / {rss['after_warmup_mib']:.1f}"
                                           f" / {rss['end_mib']:.1f} MiB"),
        ("RSS post-warm-up median / max", f"{rss['post_warmup_median_mib']:.1f} / "
                                          f"{rss['post_warmup_max_mib']:.1f} MiB"),
        ("RSS slope, second half", f"{rss['slope_second_half_mib_per_h']:+.1f} ± "
                                   f"{rss['slope_stderr_mib_per_h']} MiB/h (anon "
                                   f"{rss['anon_slope_second_half_mib_per_h']:+.1f})"),
        ("calls/s achieved, proxy CPU", f"{summary['achieved_calls_per_s_post_warmup']:.1f}, "
                                        f"{summary['cpu_pct_post_warmup']:.0f}% of a core"),
        ("latency p50 / p99 / max", f"{lat['p50_ms']} / {lat['p99_ms']} / {lat['max_ms']} ms"),
        ("calls, ok, streams, 403 probes", f"{summary['calls']}, {summary['ok']}, "
                                           f"{summary['streams']}, {summary['rejected_403']}"),
        ("episodes begun / ended", f"{summary['episodes_started']} / "
                                     f"{records['episodes_expected']}"),
        ("errors, unsent", f"{summary['errors']}, {summary['unsent']}"),
        ("turn records ok / 200s", f"{records['turn_records_ok']} / "
                                   f"{records['turns_answered_200']} ("
                                   f"{records['turns_missing']} missing, "
                                   f"{records['turns_mislabelled']} mislabelled)"),
        ("episode records / ended", f"{records['episode_records']} / "
                                    f"{records['episodes_expected']}"),
        ("queue depth max, log size", f"{summary['queue_depth_max']:g}, "
                                      f"{summary['trajectory_mib_end']:.0f} MiB"),
        ("shutdown (SIGTERM)", f"{summary['shutdown_s']} s, exit {summary['proxy_exit_code']}"),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def plot(rows: list[dict[str, Any]], summary: dict[str, Any], args: argparse.Namespace) -> str:
    """Three stacked panels: memory (with the second-half fit), latency, load."""
    loaded = [r for r in rows if "calls_per_s" in r and not r.get("partial")]
    labels = [f"{r['t_s'] / 60:.1f}" for r in loaded]
    fit = summary["rss"]["fit"]
    fitted = [fit["intercept_mib"] + fit["slope_mib_per_s"] * r["t_s"]
              if r["t_s"] >= fit["from_s"] else None for r in loaded]
    x_title = "minutes since the load started"
    panels = [
        line_chart("Proxy memory (MiB)", labels, [
            Series("VmRSS", [r["rss_mib"] for r in loaded]),
            Series("RssAnon", [r["anon_mib"] for r in loaded]),
            Series(f"fit, {summary['rss']['slope_second_half_mib_per_h']:+.1f} MiB/h", fitted),
        ], x_title=x_title, y_title="MiB", percent=False, width=820, height=300),
        line_chart("Latency from the scheduled send (ms)", labels, [
            Series("p50", [r["p50_ms"] for r in loaded]),
            Series("p99", [r["p99_ms"] for r in loaded]),
        ], x_title=x_title, y_title="ms", percent=False, width=820, height=260),
        line_chart("Load", labels, [
            Series("calls/s answered", [r["calls_per_s"] for r in loaded]),
            Series("proxy CPU, % of a core", [r["cpu_pct"] for r in loaded]),
            Series("errors per sample", [r["errors"] for r in loaded]),
        ], x_title=x_title, y_title="", percent=False, width=820, height=260),
    ]
    title = (f"budgetproxy soak: {args.minutes:g} min, {args.rate:g} calls/s, "
             f"{args.episodes} episode slots, {100 * args.stream_share:g}% streaming; "
             f"warm-up {summary['warmup_s'] / 60:g} min")
    parts, y, width = [], 30, 0
    for svg in panels:
        w = int(svg.split('width="', 1)[1].split('"', 1)[0])
        h = int(svg.split('height="', 1)[1].split('"', 1)[0])
        parts.append(svg.replace("<svg ", f'<svg x="0" y="{y}" ', 1))
        y += h + 10
        width = max(width, w)
    head = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{y}" '
            f'viewBox="0 0 {width} {y}" font-family="system-ui, sans-serif">'
            f'<rect width="100%" height="100%" fill="#fff"/>'
            f'<text x="12" y="20" font-size="14" font-weight="600">{escape(title)}</text>')
    return "\n".join([head, *parts, "</svg>"]) + "\n"
