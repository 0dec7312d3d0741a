"""Builds budgetproxy's classic-JSON Grafana dashboards; run it to rewrite grafana/dashboards/.

The JSON files are what Grafana loads (by provisioning or import); this script is their source,
so that every panel shares one datasource, one set of label filters and one counting rule.
Run `python grafana/generate.py` after editing, and commit both.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

DATASOURCE_UID = "budgetproxy-prometheus"
DS: dict[str, str] = {"type": "prometheus", "uid": DATASOURCE_UID}
SCHEMA_VERSION = 39
OUT_DIR = Path(__file__).resolve().parent / "dashboards"

# Label filters every episode panel applies: the tier and arm (disclosure) picked on top.
EPISODE = 'tier=~"$tier",disclosure=~"$arm"'
# T values for the "success within T" panels; both spellings of a bucket bound match
# (Prometheus 2 keeps le="5.0" as exposed, Prometheus 3 normalises it to le="5").
LE_T = 'le=~"(${turns:pipe})(\\\\.0)?"'
LE_TOKENS = 'le=~"(${tokens:pipe})(\\\\.0)?"'
LE_COST = 'le=~"(${cost:pipe})(\\\\.0)?"'
LE_SECONDS = 'le=~"(${seconds:pipe})(\\\\.0)?"'

Json = dict[str, Any]


# ---- PromQL building blocks ------------------------------------------------------------------


def count_in(selector: str, window: str) -> str:
    """How much the counter `selector` grew within `window`, per series, as exact integers.

    `increase()` extrapolates and never sees the first sample of a series, and prometheus_client
    creates a labelled series only when it is first incremented: a tier, arm or outcome whose
    first episodes finish inside the window would be undercounted by its first scrape (often all
    of it, for small evaluation runs). Here the growth is the highest value in the window minus
    the value at its start; a series that did not exist at the start (or was reset below it)
    counts from zero. `max_over_time` keeps a replica that went away inside the window counted.
    """
    peak = f"max_over_time({selector}[{window}])"
    return f"(({peak} - {selector} offset {window}) >= 0 or {peak})"


def finished(matchers: str, window: str, by: str = "tier, disclosure") -> str:
    """Finished episodes within `window`, summed by `by`."""
    sel = f"budgetproxy_episodes_finished_total{{{matchers}}}"
    return f"sum by ({by}) ({count_in(sel, window)})" if by else f"sum({count_in(sel, window)})"


def share(
    outcome_matcher: str, window: str, by: str = "tier, disclosure", base: str = EPISODE
) -> str:
    """Share of judged (not abandoned) finished episodes whose end reason matches.

    0 when none matched; no value (rather than NaN) where no episode finished in the window.
    """
    den = finished(f'{base},outcome!="abandoned"', window, by)
    num = finished(f"{base},{outcome_matcher}", window, by)
    zero = f"0 * {den}" if by else "vector(0)"
    return f"({num} or {zero})\n/\n({den} > 0)"


def success_within(window: str, le_matcher: str, metric: str = "budgetproxy_episode_turns"
                   ) -> str:
    """Pooled success-within-T (live Pass@(1,T)): successes at turn <= T over judged episodes.
    With another spend histogram, successes that spent at most B over the judged episodes that
    histogram observed (those with a budget on its axis): an episode whose spend was not
    measured is neither a success nor a failure within B."""
    bucket = f'{metric}_bucket{{{EPISODE},outcome="success",{le_matcher}}}'
    num = f"sum by (tier, disclosure, le) ({count_in(bucket, window)})"
    if metric == "budgetproxy_episode_turns":
        den = finished(f'{EPISODE},outcome!="abandoned"', window)
    else:
        observed = f'{metric}_count{{{EPISODE},outcome!="abandoned"}}'
        den = f"sum by (tier, disclosure) ({count_in(observed, window)})"
    return f"{num}\n/ ignoring(le) group_left()\n({den} > 0)"


def quantile(q: float, metric: str, matchers: str, by: str = "") -> str:
    keep = f"le, {by}" if by else "le"
    return (
        f"histogram_quantile({q}, sum by ({keep}) "
        f"(rate({metric}_bucket{{{matchers}}}[$__rate_interval])))"
    )


def rate_by(metric: str, matchers: str, by: str) -> str:
    selector = f"{metric}{{{matchers}}}" if matchers else metric
    return f"sum by ({by}) (rate({selector}[$__rate_interval]))"


# ---- panel building blocks -------------------------------------------------------------------


def target(
    expr: str,
    legend: str = "__auto",
    *,
    ref: str = "A",
    instant: bool = False,
    fmt: str = "time_series",
    interval: str = "",
) -> Json:
    t: Json = {
        "datasource": dict(DS),
        "editorMode": "code",
        "expr": expr,
        "format": fmt,
        "instant": instant,
        "legendFormat": legend,
        "range": not instant,
        "refId": ref,
    }
    if interval:
        t["interval"] = interval
    return t


def _targets(*items: Json) -> list[Json]:
    return [dict(t, refId=chr(ord("A") + i)) for i, t in enumerate(items)]


def _thresholds(*steps: tuple[float | None, str]) -> Json:
    return {"mode": "absolute", "steps": [{"color": c, "value": v} for v, c in steps]}


_PLAIN = _thresholds((None, "green"))
_BAD_HIGH = _thresholds((None, "green"), (0.05, "orange"), (0.25, "red"))


def stat(
    title: str,
    description: str,
    expr: str,
    unit: str = "short",
    *,
    thresholds: Json = _PLAIN,
    decimals: int | None = None,
    instant: bool = True,
) -> Json:
    defaults: Json = {"unit": unit, "color": {"mode": "thresholds"}, "thresholds": thresholds}
    if decimals is not None:
        defaults["decimals"] = decimals
    return {
        "type": "stat",
        "title": title,
        "description": description,
        "datasource": dict(DS),
        "targets": [target(expr, "", instant=instant)],
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "value",
            "graphMode": "none" if instant else "area",
            "justifyMode": "auto",
            "orientation": "auto",
            "textMode": "auto",
            "wideLayout": True,
            "showPercentChange": False,
        },
    }


def timeseries(
    title: str,
    description: str,
    targets: list[Json],
    unit: str = "short",
    *,
    bars: bool = False,
    stacked: bool = False,
    min_: float | None = 0,
    max_: float | None = None,
    interval: str = "",
) -> Json:
    custom: Json = {
        "drawStyle": "bars" if bars else "line",
        "lineWidth": 1,
        "fillOpacity": 70 if bars else 10,
        "showPoints": "never",
        "spanNulls": False,
        "stacking": {"mode": "normal" if stacked else "none", "group": "A"},
        "axisSoftMin": min_,
    }
    defaults: Json = {"unit": unit, "color": {"mode": "palette-classic"}, "custom": custom}
    if max_ is not None:
        defaults["max"] = max_
    panel: Json = {
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": dict(DS),
        "targets": _targets(*targets),
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {
            "legend": {
                "showLegend": True,
                "displayMode": "list",
                "placement": "bottom",
                "calcs": [],
            },
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
    }
    if interval:
        panel["interval"] = interval
    return panel


def bargauge(
    title: str,
    description: str,
    targets: list[Json],
    unit: str = "short",
    *,
    min_: float | None = 0,
    max_: float | None = None,
    thresholds: Json = _PLAIN,
    vertical: bool = False,
) -> Json:
    defaults: Json = {"unit": unit, "color": {"mode": "thresholds"}, "thresholds": thresholds}
    if min_ is not None:
        defaults["min"] = min_
    if max_ is not None:
        defaults["max"] = max_
    return {
        "type": "bargauge",
        "title": title,
        "description": description,
        "datasource": dict(DS),
        "targets": _targets(*targets),
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "displayMode": "gradient",
            "orientation": "vertical" if vertical else "horizontal",
            "showUnfilled": True,
            "valueMode": "color",
            "namePlacement": "auto",
            "sizing": "auto",
            "minVizHeight": 16,
            "minVizWidth": 8,
            "maxVizHeight": 300,
        },
    }


def row(title: str) -> Json:
    return {"type": "row", "title": title, "collapsed": False, "panels": []}


def layout(*rows: tuple[int, list[tuple[Json, int]]]) -> list[Json]:
    """Give panels ids and grid positions: each row is (height, [(panel, width), ...])."""
    panels: list[Json] = []
    y = 0
    for height, items in rows:
        x = 0
        for panel, width in items:
            h = 1 if panel["type"] == "row" else height
            panels.append(
                {"id": len(panels) + 1, "gridPos": {"h": h, "w": width, "x": x, "y": y}, **panel}
            )
            x += width
        y += 1 if items and items[0][0]["type"] == "row" else height
    return panels


def query_var(name: str, label: str, metric: str, label_name: str, description: str) -> Json:
    query = f"label_values({metric}, {label_name})"
    return {
        "name": name,
        "label": label,
        "description": description,
        "type": "query",
        "datasource": dict(DS),
        "definition": query,
        "query": {
            "qryType": 1,
            "query": query,
            "refId": "PrometheusVariableQueryEditor-VariableQuery",
        },
        "refresh": 2,
        "regex": "",
        "sort": 1,
        "multi": True,
        "includeAll": True,
        "allValue": ".*",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "options": [],
        "hide": 0,
        "skipUrlSync": False,
    }


def custom_var(
    name: str,
    label: str,
    values: list[str],
    chosen: list[str],
    description: str,
    *,
    kind: str = "custom",
    multi: bool = True,
) -> Json:
    current: Json = (
        {"selected": True, "text": chosen, "value": chosen}
        if multi
        else {"selected": True, "text": chosen[0], "value": chosen[0]}
    )
    var: Json = {
        "name": name,
        "label": label,
        "description": description,
        "type": kind,
        "query": ",".join(values),
        "multi": multi,
        "includeAll": False,
        "current": current,
        "options": [{"selected": v in chosen, "text": v, "value": v} for v in values],
        "hide": 0,
        "skipUrlSync": False,
    }
    if kind == "interval":
        var.update({"auto": False, "auto_count": 30, "auto_min": "10s", "refresh": 2})
    return var


def dashboard(
    uid: str, title: str, description: str, panels: list[Json], variables: list[Json]
) -> Json:
    return {
        "annotations": {
            "list": [
                {
                    "builtIn": 1,
                    "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                    "enable": True,
                    "hide": True,
                    "iconColor": "rgba(0, 211, 255, 1)",
                    "name": "Annotations & Alerts",
                    "type": "dashboard",
                }
            ]
        },
        "description": description,
        "editable": True,
        "fiscalYearStartMonth": 0,
        "graphTooltip": 1,
        "id": None,
        "links": [
            {
                "asDropdown": False,
                "includeVars": False,
                "keepTime": True,
                "tags": ["budgetproxy"],
                "targetBlank": False,
                "title": "budgetproxy",
                "type": "dashboards",
                "icon": "external link",
                "tooltip": "",
                "url": "",
            }
        ],
        "panels": panels,
        "refresh": "30s",
        "schemaVersion": SCHEMA_VERSION,
        "tags": ["budgetproxy"],
        "templating": {"list": variables},
        "time": {"from": "now-6h", "to": "now"},
        "timepicker": {},
        "timezone": "",
        "title": title,
        "uid": uid,
        "version": 1,
        "weekStart": "",
    }


# ---- Agent budgets ---------------------------------------------------------------------------


def _pass_at_t_curve() -> Json:
    """Bar chart of success-within-T against T: the live Pass@(1,T) curve per tier and arm."""
    expr = (
        "label_join(\n"
        + success_within("$__range", 'le!="+Inf"')
        + '\n, "series", " · ", "tier", "disclosure")'
    )
    first = "le\\series"  # the row-key column groupingToMatrix names "<rowField>\<columnField>"
    return {
        "type": "barchart",
        "title": "Live Pass@T curve: success within T turns",
        "description": (
            "For each T (x axis, 1..64 turns), the share of judged episodes (success, failure, "
            "exhausted; not abandoned) in the time range that succeeded at turn T or earlier, "
            "per tier and arm. Pooled over tasks: a live Pass@(1,T); `budgetproxy analyze` "
            "gives the per-task Pass@(K,T) with confidence intervals."
        ),
        "datasource": dict(DS),
        "targets": [target(expr, "", instant=True, fmt="table")],
        "transformations": [
            {
                "id": "groupingToMatrix",
                "options": {"columnField": "series", "rowField": "le", "valueField": "Value"},
            },
            {
                "id": "convertFieldType",
                "options": {
                    "fields": {},
                    "conversions": [{"targetField": first, "destinationType": "number"}],
                },
            },
            {"id": "sortBy", "options": {"fields": {}, "sort": [{"field": first, "desc": False}]}},
            {
                "id": "convertFieldType",
                "options": {
                    "fields": {},
                    "conversions": [{"targetField": first, "destinationType": "string"}],
                },
            },
            {"id": "organize", "options": {"renameByName": {first: "T (turns)"}}},
        ],
        "fieldConfig": {
            "defaults": {
                "unit": "percentunit",
                "min": 0,
                "max": 1,
                "color": {"mode": "palette-classic"},
                "custom": {"fillOpacity": 80, "lineWidth": 1, "gradientMode": "none"},
            },
            "overrides": [],
        },
        "options": {
            "xField": "T (turns)",
            "orientation": "vertical",
            "barWidth": 0.9,
            "groupWidth": 0.8,
            "showValue": "never",
            "stacking": "none",
            "xTickLabelRotation": 0,
            "xTickLabelSpacing": 50,
            "fullHighlight": False,
            "legend": {
                "showLegend": True,
                "displayMode": "list",
                "placement": "bottom",
                "calcs": [],
            },
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
    }


def _turns_heatmap() -> Json:
    bucket = f'budgetproxy_episode_turns_bucket{{{EPISODE},outcome=~"$outcome"}}'
    return {
        "type": "heatmap",
        "title": "Turns per finished episode over time",
        "description": (
            "Finished episodes per interval by turns used (for successes: the turn of success), "
            "as a heatmap. Filtered by tier, arm and outcome."
        ),
        "datasource": dict(DS),
        "interval": "1m",
        "targets": [
            target(f"sum by (le) ({count_in(bucket, '$__interval')})", "{{le}}", fmt="heatmap")
        ],
        "fieldConfig": {
            "defaults": {
                "custom": {
                    "hideFrom": {"legend": False, "tooltip": False, "viz": False},
                    "scaleDistribution": {"type": "linear"},
                }
            },
            "overrides": [],
        },
        "options": {
            "calculate": False,
            "cellGap": 1,
            "color": {
                "mode": "scheme",
                "scheme": "Oranges",
                "scale": "exponential",
                "exponent": 0.5,
                "steps": 64,
                "reverse": False,
                "fill": "dark-orange",
            },
            "exemplars": {"color": "rgba(255,0,255,0.7)"},
            "filterValues": {"le": 1e-9},
            "legend": {"show": True},
            "rowsFrame": {"layout": "auto"},
            "showValue": "never",
            "tooltip": {"mode": "single", "show": True, "yHistogram": False},
            "yAxis": {
                "axisPlacement": "left",
                "reverse": False,
                "unit": "short",
                "axisLabel": "turns",
            },
        },
    }


def agent_budgets() -> Json:
    turns_sel = f"budgetproxy_turns_total{{{EPISODE}}}"
    refused_sel = f"budgetproxy_budget_exhausted_total{{{EPISODE}}}"
    hist = f'budgetproxy_episode_turns_%s{{{EPISODE},outcome=~"$outcome"}}'
    per_outcome = "tier, disclosure, outcome"
    per_arm = "tier, disclosure"

    def arm_rate(arm: str) -> str:
        base = f'tier=~"$tier",disclosure="{arm}"'
        return share('outcome="success"', "$__range", "tier", base)

    stats = [
        (
            stat(
                "Active episodes",
                "Episodes started and not yet finished, over all replicas.",
                "sum(budgetproxy_active_episodes)",
            ),
            4,
        ),
        (
            stat(
                "Episodes finished",
                "Episodes that ended in the time range (any end reason).",
                finished(EPISODE, "$__range", ""),
            ),
            4,
        ),
        (
            stat(
                "Success rate",
                "Successes / judged episodes (not abandoned) in the time range.",
                share('outcome="success"', "$__range", ""),
                "percentunit",
                decimals=1,
            ),
            4,
        ),
        (
            stat(
                "Exhaustion rate",
                "Episodes that ended by running out of budget / judged episodes, in the range.",
                share('outcome="exhausted"', "$__range", ""),
                "percentunit",
                decimals=1,
                thresholds=_BAD_HIGH,
            ),
            4,
        ),
        (
            stat(
                "Turns forwarded",
                "Charged turns forwarded upstream in the time range.",
                f"sum({count_in(turns_sel, '$__range')})",
            ),
            4,
        ),
        (
            stat(
                "Budget refusals",
                "Model calls refused (403) or answered with a synthetic finish because the "
                "episode's budget was spent, in the time range.",
                f"sum({count_in(refused_sel, '$__range')}) or vector(0)",
            ),
            4,
        ),
    ]
    success = [
        (
            bargauge(
                "Success rate by tier and arm",
                "Successes / judged episodes (success, failure, exhausted) that finished in the "
                "time range, per budget tier and disclosure arm.",
                [
                    target(
                        share('outcome="success"', "$__range"),
                        "{{tier}} · {{disclosure}}",
                        instant=True,
                    )
                ],
                "percentunit",
                max_=1,
            ),
            8,
        ),
        (
            bargauge(
                "Disclosed − hidden success rate by tier",
                "Difference in success rate between the disclosed and the hidden arm, per tier "
                "(percentage points as a fraction). Positive: announcing the budget helped.",
                [
                    target(
                        f"{arm_rate('disclosed')}\n-\n{arm_rate('hidden')}",
                        "{{tier}}",
                        instant=True,
                    )
                ],
                "percentunit",
                min_=-1,
                max_=1,
                thresholds=_thresholds((None, "red"), (0, "green")),
            ),
            8,
        ),
        (
            bargauge(
                "Exhaustion rate by tier and arm",
                "Share of judged episodes that ended because the budget ran out, per tier and arm.",
                [
                    target(
                        share('outcome="exhausted"', "$__range"),
                        "{{tier}} · {{disclosure}}",
                        instant=True,
                    )
                ],
                "percentunit",
                max_=1,
                thresholds=_BAD_HIGH,
            ),
            8,
        ),
    ]
    pass_at_t = [
        (_pass_at_t_curve(), 12),
        (
            bargauge(
                "Success within T (chosen T)",
                "Live Pass@(1,T) at the T values picked in the `T` variable, per tier and arm, "
                "over the time range.",
                [
                    target(
                        success_within("$__range", LE_T),
                        "{{tier}} · {{disclosure}} · T≤{{le}}",
                        instant=True,
                    )
                ],
                "percentunit",
                max_=1,
            ),
            6,
        ),
        (
            timeseries(
                "Success within T over time",
                "Live Pass@(1,T) at the chosen T values over a trailing window "
                "(`window` variable).",
                [target(success_within("$window", LE_T), "T≤{{le}} {{tier}} {{disclosure}}")],
                "percentunit",
                max_=1,
            ),
            6,
        ),
    ]
    outcomes = [
        (
            timeseries(
                "Outcomes over time",
                "Episodes finished per interval by end reason (success, failure, exhausted, "
                "abandoned).",
                [target(finished(EPISODE, "$__interval", "outcome"), "{{outcome}}")],
                bars=True,
                stacked=True,
                interval="1m",
            ),
            8,
        ),
        (
            timeseries(
                "Success rate over time by tier and arm",
                "Success rate over a trailing window (`window` variable), per tier and arm.",
                [target(share('outcome="success"', "$window"), "{{tier}} · {{disclosure}}")],
                "percentunit",
                max_=1,
            ),
            8,
        ),
        (
            timeseries(
                "Active episodes over time",
                "Episodes started and not yet finished, over all replicas.",
                [target("sum(budgetproxy_active_episodes)", "active")],
            ),
            8,
        ),
    ]
    turns = [
        (
            bargauge(
                "Turns per episode distribution",
                "Finished episodes in the time range by turns used (successes: the turn of "
                "success), filtered by tier, arm and outcome. Each bar is one turn count.",
                [
                    target(
                        f"sum by (le) ({count_in(hist % 'bucket', '$__range')})",
                        "{{le}}",
                        instant=True,
                        fmt="heatmap",
                    )
                ],
                vertical=True,
            ),
            12,
        ),
        (_turns_heatmap(), 12),
    ]
    turns2 = [
        (
            bargauge(
                "Mean turns per episode",
                "Average turns used per finished episode in the time range, by tier, arm and end "
                "reason (successes: the turn of success).",
                [
                    target(
                        f"sum by ({per_outcome}) ({count_in(hist % 'sum', '$__range')})\n/\n"
                        f"(sum by ({per_outcome}) ({count_in(hist % 'count', '$__range')}) > 0)",
                        "{{tier}} · {{disclosure}} · {{outcome}}",
                        instant=True,
                    )
                ],
                "short",
            ),
            8,
        ),
        (
            timeseries(
                "Turns per minute by tier and arm",
                "Charged turns forwarded upstream per minute.",
                [
                    target(
                        f"60 * {rate_by('budgetproxy_turns_total', EPISODE, per_arm)}",
                        "{{tier}} · {{disclosure}}",
                    )
                ],
            ),
            8,
        ),
        (
            timeseries(
                "Episodes started and budget refusals per minute",
                "Episodes started per minute, and model calls refused or finished for budget per "
                "minute, per tier and arm.",
                [
                    target(
                        f"60 * {rate_by('budgetproxy_episodes_started_total', EPISODE, per_arm)}",
                        "started {{tier}} · {{disclosure}}",
                    ),
                    target(
                        f"60 * {rate_by('budgetproxy_budget_exhausted_total', EPISODE, per_arm)}",
                        "refused {{tier}} · {{disclosure}}",
                    ),
                ],
            ),
            8,
        ),
    ]
    def mean_spend(metric: str) -> str:
        sel = f'{metric}_%s{{{EPISODE},outcome=~"$outcome"}}'
        return (f"sum by ({per_outcome}) ({count_in(sel % 'sum', '$__range')})\n/\n"
                f"(sum by ({per_outcome}) ({count_in(sel % 'count', '$__range')}) > 0)")

    def within_b(unit: str, le: str, metric: str, suffix: str, text: str) -> tuple[Json, int]:
        """A live success-within-B panel along one budget axis (one spend histogram)."""
        return (
            bargauge(f"Success within B {unit} (chosen B)", text,
                     [target(success_within("$__range", le, metric),
                             f"{{{{tier}}}} · {{{{disclosure}}}} · B≤{{{{le}}}}{suffix}",
                             instant=True)],
                     "percentunit", max_=1),
            6,
        )

    exhausted_sel = f"budgetproxy_episodes_exhausted_total{{{EPISODE}}}"
    spend = [
        (
            bargauge(
                "Episodes exhausted by axis",
                "Episodes that ended exhausted in the time range, by the budget that ran out "
                "(turns, tokens, cost, time).",
                [target(f"sum by (axis) ({count_in(exhausted_sel, '$__range')})", "{{axis}}",
                        instant=True)],
                "short",
            ),
            6,
        ),
        within_b("tokens", LE_TOKENS, "budgetproxy_episode_tokens", "",
                 "Live Pass@(1,B) along tokens at the B values picked in the `tokens` variable: "
                 "successes that spent at most B tokens (up to their outcome report) over the "
                 "judged episodes with a budget beside turns, per tier and arm, over the time "
                 "range. `analyze --axis tokens` is exact (spend at the success turn)."),
        within_b("dollars", LE_COST, "budgetproxy_episode_cost_usd", " USD",
                 "Live Pass@(1,B) along cost at the B values (USD) picked in the `cost` variable: "
                 "successes that spent at most B dollars (up to their outcome report) over the "
                 "judged episodes with a cost budget, per tier and arm, over the time range. "
                 "`analyze --axis cost` is exact (spend at the success turn)."),
        within_b("seconds", LE_SECONDS, "budgetproxy_episode_seconds", " s",
                 "Live Pass@(1,B) along wall-clock time at the B values picked in the `seconds` "
                 "variable: "
                 "successes reported within B seconds of their first call over the judged "
                 "episodes with a budget beside turns, per tier and arm, over the time range. "
                 "`analyze --axis seconds` is exact (time at the success turn)."),
        (
            bargauge(
                "Mean tokens per episode",
                "Tokens (input + output, cached input included) per finished episode with a "
                "budget beside turns, in the time range, by tier, arm and end reason.",
                [target(mean_spend("budgetproxy_episode_tokens"),
                        "{{tier}} · {{disclosure}} · {{outcome}}", instant=True)],
                "short",
            ),
            6,
        ),
        (
            bargauge(
                "Mean seconds per episode",
                "Wall-clock seconds from the first call per finished episode with a budget "
                "beside turns, in the time range, by tier, arm and end reason.",
                [target(mean_spend("budgetproxy_episode_seconds"),
                        "{{tier}} · {{disclosure}} · {{outcome}}", instant=True)],
                "s",
            ),
            6,
        ),
    ]
    spend = [(panel, 24 // len(spend)) for panel, _ in spend]  # one row of equal panels
    panels = layout(
        (1, [(row("Overview"), 24)]),
        (4, stats),
        (1, [(row("Success by budget tier and arm"), 24)]),
        (8, success),
        (1, [(row("Live Pass@T"), 24)]),
        (9, pass_at_t),
        (1, [(row("Outcomes"), 24)]),
        (8, outcomes),
        (1, [(row("Turns per episode"), 24)]),
        (9, turns),
        (8, turns2),
        (1, [(row("Budgets beside turns (tokens, cost, time)"), 24)]),
        (8, spend),
    )
    variables = [
        query_var(
            "tier",
            "Tier",
            "budgetproxy_episodes_started_total",
            "tier",
            "Budget tier: budget / max_turns rounded to 5% (n/a without max_turns).",
        ),
        query_var(
            "arm",
            "Arm",
            "budgetproxy_episodes_started_total",
            "disclosure",
            "Disclosure arm: hidden or disclosed.",
        ),
        query_var(
            "outcome",
            "Outcome",
            "budgetproxy_episodes_finished_total",
            "outcome",
            "End reason, for the turns-per-episode panels.",
        ),
        custom_var(
            "turns",
            "T",
            [str(t) for t in (1, 2, 3, 4, 5, 6, 8, 10, 12, 15, 16, 20, 25, 30, 32, 40, 48, 50, 64)],
            ["5", "10", "20"],
            "Turn limits T for the success-within-T panels.",
        ),
        custom_var(
            "tokens",
            "B (tokens)",
            ["1000", "2500", "5000", "10000", "25000", "50000", "100000", "250000", "500000"],
            ["1000", "10000", "100000"],
            "Token budgets B for the success-within-B panel (bucket bounds of "
            "budgetproxy_episode_tokens).",
        ),
        custom_var(
            "cost",
            "B (USD)",
            # No ".0" on whole numbers: the values go into a regex, where "1.0" would match
            # le="100.0" too (the dot matches any character); "1" with (\.0)? matches only 1.
            ["0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1", "2.5", "5", "10"],
            ["0.1", "1"],
            "Cost budgets B in USD for the success-within-B panel (bucket bounds of "
            "budgetproxy_episode_cost_usd).",
        ),
        custom_var(
            "seconds",
            "B (seconds)",
            ["10", "30", "60", "120", "300", "600", "1200", "1800", "3600", "7200"],
            ["60", "600"],
            "Time budgets B in seconds for the success-within-B panel (bucket bounds of "
            "budgetproxy_episode_seconds).",
        ),
        custom_var(
            "window",
            "Window",
            ["15m", "1h", "6h", "1d", "7d"],
            ["1h"],
            "Trailing window of the over-time rate panels.",
            kind="interval",
            multi=False,
        ),
    ]
    return dashboard(
        "budgetproxy-agent-budgets",
        "Agent budgets",
        "budgetproxy: success per budget tier and disclosure arm, live Pass@T, turns per "
        "episode, budget exhaustion.",
        panels,
        variables,
    )


# ---- Proxy health ----------------------------------------------------------------------------


def proxy_health() -> Json:
    route = 'route=~"$route"'
    upstream = 'upstream=~"$upstream"'
    model = 'model=~"$model"'
    req = "budgetproxy_requests_total"

    def quantiles(metric: str, matchers: str, by: str) -> list[Json]:
        return [
            target(quantile(q, metric, matchers, by), f"p{int(q * 100)} {{{{{by}}}}}")
            for q in (0.5, 0.95, 0.99)
        ]

    errors_5xx = rate_by(req, f'{route},code=~"5.."', "route")
    all_by_route = rate_by(req, route, "route")
    stats = [
        (
            stat(
                "Requests / s",
                "All requests the proxy answered, per second.",
                f"sum(rate({req}{{{route}}}[$__rate_interval]))",
                "reqps",
                instant=False,
            ),
            4,
        ),
        (
            stat(
                "5xx share",
                "Share of requests answered with a 5xx status.",
                f'(sum(rate({req}{{{route},code=~"5.."}}[$__rate_interval])) or vector(0))\n/\n'
                f"(sum(rate({req}{{{route}}}[$__rate_interval])) > 0)",
                "percentunit",
                thresholds=_BAD_HIGH,
                decimals=2,
                instant=False,
            ),
            4,
        ),
        (
            stat(
                "p99 request latency",
                "99th percentile of request duration, all routes chosen.",
                quantile(0.99, "budgetproxy_request_duration_seconds", route),
                "s",
                instant=False,
            ),
            4,
        ),
        (
            stat(
                "p99 proxy overhead",
                "99th percentile of the time the proxy adds (request duration minus upstream "
                "time).",
                quantile(0.99, "budgetproxy_proxy_overhead_seconds", route),
                "s",
                instant=False,
            ),
            4,
        ),
        (
            stat(
                "Upstream errors / s",
                "Upstream failures of any class, per second.",
                f"sum(rate(budgetproxy_upstream_errors_total{{{upstream}}}[$__rate_interval])) "
                "or vector(0)",
                "reqps",
                instant=False,
            ),
            4,
        ),
        (
            stat(
                "Trajectory queue depth",
                "Records waiting for the trajectory writer; a growing queue slows calls down.",
                "sum(budgetproxy_trajectory_queue_depth)",
                instant=False,
            ),
            4,
        ),
    ]
    traffic = [
        (
            timeseries(
                "Requests by route and status",
                "Requests per second by route template and HTTP status.",
                [target(rate_by(req, route, "route, code"), "{{route}} {{code}}")],
                "reqps",
            ),
            12,
        ),
        (
            timeseries(
                "5xx share by route",
                "Share of each route's requests answered with a 5xx status.",
                [
                    target(
                        f"({errors_5xx} or 0 * {all_by_route})\n/\n({all_by_route} > 0)",
                        "{{route}}",
                    )
                ],
                "percentunit",
                max_=1,
            ),
            12,
        ),
    ]
    latency = [
        (
            timeseries(
                "Request latency",
                "p50 / p95 / p99 of the whole request as the proxy served it, by route "
                "(streams: until the last byte).",
                quantiles("budgetproxy_request_duration_seconds", route, "route"),
                "s",
            ),
            8,
        ),
        (
            timeseries(
                "Proxy overhead",
                "p50 / p95 / p99 of the time the proxy adds on top of the upstream call, by route.",
                quantiles("budgetproxy_proxy_overhead_seconds", route, "route"),
                "s",
            ),
            8,
        ),
        (
            timeseries(
                "Upstream latency",
                "p50 / p95 / p99 of upstream call duration, by configured upstream.",
                quantiles("budgetproxy_upstream_duration_seconds", upstream, "upstream"),
                "s",
            ),
            8,
        ),
    ]
    upstream_row = [
        (
            timeseries(
                "Time to first token",
                "p50 / p95 / p99 of time to the first streamed token, by model.",
                quantiles("budgetproxy_time_to_first_token_seconds", model, "model"),
                "s",
            ),
            8,
        ),
        (
            timeseries(
                "Upstream errors by class",
                "Upstream failures per second by upstream and class (connect, timeout, "
                "status_4xx, status_429, status_5xx, stream_broken).",
                [
                    target(
                        rate_by("budgetproxy_upstream_errors_total", upstream, "upstream, class"),
                        "{{upstream}} {{class}}",
                    )
                ],
                "reqps",
                bars=True,
                stacked=True,
            ),
            8,
        ),
        (
            timeseries(
                "Tokens per second",
                "Input and output tokens per second by model (from upstream usage).",
                [
                    target(
                        rate_by("budgetproxy_tokens_total", model, "model, direction"),
                        "{{model}} {{direction}}",
                    )
                ],
            ),
            8,
        ),
    ]
    tokens_sel = f"budgetproxy_tokens_total{{{model}}}"
    internals = [
        (
            bargauge(
                "Tokens in the time range",
                "Input and output tokens in the time range, by model.",
                [
                    target(
                        f"sum by (model, direction) ({count_in(tokens_sel, '$__range')})",
                        "{{model}} {{direction}}",
                        instant=True,
                    )
                ],
            ),
            6,
        ),
        (
            timeseries(
                "Calls without an episode",
                "Model calls per second that carried no episode id (forwarded, not counted "
                "against any budget), by route.",
                [
                    target(
                        rate_by("budgetproxy_calls_without_episode_total", route, "route"),
                        "{{route}}",
                    )
                ],
                "reqps",
            ),
            6,
        ),
        (
            timeseries(
                "Trajectory queue depth over time",
                "Records waiting for the trajectory writer, over all replicas.",
                [target("sum(budgetproxy_trajectory_queue_depth)", "queued")],
            ),
            6,
        ),
        (
            timeseries(
                "Store unavailable",
                "Calls per second that met an unavailable episode store, by the policy "
                "applied (fail_closed answers 503).",
                [
                    target(
                        rate_by("budgetproxy_store_unavailable_total", "", "policy"), "{{policy}}"
                    )
                ],
                "reqps",
                bars=True,
            ),
            6,
        ),
    ]
    tracing = [
        (
            timeseries(
                "Trace spans",
                "Model-call spans per second by what became of them: exported to the OTLP "
                "collector, failed (refused, or unreachable past the export timeout) or dropped "
                "(the export queue was full). Empty when tracing is off.",
                [
                    target(
                        rate_by("budgetproxy_trace_spans_total", "", "result"), "{{result}}"
                    )
                ],
                "ops",
                bars=True,
                stacked=True,
            ),
            24,
        ),
    ]
    panels = layout(
        (1, [(row("Overview"), 24)]),
        (4, stats),
        (1, [(row("Traffic"), 24)]),
        (8, traffic),
        (1, [(row("Latency"), 24)]),
        (8, latency),
        (1, [(row("Upstream and tokens"), 24)]),
        (8, upstream_row),
        (1, [(row("Internals"), 24)]),
        (8, internals),
        (1, [(row("Tracing"), 24)]),
        (6, tracing),
    )
    variables = [
        query_var("route", "Route", req, "route", "Route template."),
        query_var(
            "upstream",
            "Upstream",
            "budgetproxy_upstream_duration_seconds_count",
            "upstream",
            "Configured upstream name.",
        ),
        query_var(
            "model",
            "Model",
            "budgetproxy_tokens_total",
            "model",
            'Model name (the first 32 seen; the rest are "other").',
        ),
    ]
    return dashboard(
        "budgetproxy-proxy-health",
        "Proxy health",
        "budgetproxy: request rate, latency and overhead percentiles, time to first token, "
        "upstream errors, tokens.",
        panels,
        variables,
    )


# ---- Live experiments ------------------------------------------------------------------------


def experiments() -> Json:
    """One live experiment's running state (docs/experiments.md). Every replica computes the
    same numbers from the shared store: the narrowest bounds and the largest counts are the
    newest (the interval only narrows, the counts only grow)."""
    sel = 'experiment=~"$experiment"'

    def bound(name: str, agg: str) -> str:
        return f'{agg} by (experiment) (budgetproxy_experiment_difference{{{sel}, bound="{name}"}})'

    running = timeseries(
        "First arm − second arm: estimate and always-valid interval",
        "The difference in the experiment's metric between its first two arms, in the "
        "metric's units (a share for success and pass_at_tier; reward, tokens or USD), with "
        "its confidence sequence (cs_low, cs_high): valid however often it is read, so a stop "
        "taken when it excludes 0 keeps the error rate at the experiment's alpha.",
        [target(bound("cs_low", "max"), "{{experiment}} cs_low"),
         target(bound("estimate", "avg"), "{{experiment}} estimate"),
         target(bound("cs_high", "min"), "{{experiment}} cs_high")],
        "short", min_=None,
    )
    rate = timeseries(
        "Metric per arm",
        "The metric's mean per arm in its units: the success rate for success (abandoned "
        "episodes left out).",
        [target(f"max by (experiment, arm) (budgetproxy_experiment_estimate{{{sel}}})",
                "{{experiment}} {{arm}}")],
        "short", max_=None,
    )
    counts = bargauge(
        "Episodes per arm",
        "Finished episodes per arm so far.",
        [target(f"max by (experiment, arm) (budgetproxy_experiment_episodes{{{sel}}})",
                "{{experiment}} {{arm}}", instant=True)],
    )
    decision = stat(
        "Decision",
        "continue, stop_a_better, stop_b_better or stop_futile: the experiment's decision now "
        "(for tokens and cost, the better arm spends less).",
        f"max by (experiment, decision) (budgetproxy_experiment_decision{{{sel}}}) == 1",
    )
    decision["options"]["textMode"] = "name"
    decision["targets"][0]["legendFormat"] = "{{experiment}}: {{decision}}"
    panels = layout(
        (9, [(running, 16), (decision, 8)]),
        (8, [(rate, 12), (counts, 12)]),
    )
    variables = [query_var("experiment", "Experiment", "budgetproxy_experiment_episodes",
                           "experiment", "Experiments named in the proxy's config.")]
    return dashboard(
        "budgetproxy-experiments",
        "Live experiments",
        "budgetproxy: a live experiment's arms, the running difference with its always-valid "
        "interval, and its decision.",
        panels,
        variables,
    )


DASHBOARDS = {"agent-budgets.json": agent_budgets, "proxy-health.json": proxy_health,
              "experiments.json": experiments}


def render(build: Any) -> str:
    return json.dumps(build(), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str]) -> int:
    out = Path(argv[1]) if len(argv) > 1 else OUT_DIR
    out.mkdir(parents=True, exist_ok=True)
    for name, build in DASHBOARDS.items():
        (out / name).write_text(render(build), encoding="utf-8")
        print(out / name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
